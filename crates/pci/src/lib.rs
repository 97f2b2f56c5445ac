//! A PCI function as state (filled in by the pci work).
#![forbid(unsafe_code)]
