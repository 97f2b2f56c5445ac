//! A user-space NVMe host driver (filled in by the driver work).
