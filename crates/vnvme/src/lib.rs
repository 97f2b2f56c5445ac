//! The vnvme glue: the NVMe PCI device served over vfio-user, and benchmarks.
#![forbid(unsafe_code)]
