//! The vfio-user protocol (filled in by the vfio-user work).
