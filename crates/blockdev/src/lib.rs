//! Namespace storage backends (filled in by the controller work).
#![forbid(unsafe_code)]
