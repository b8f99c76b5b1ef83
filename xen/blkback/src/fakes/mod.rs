//! In-memory stand-ins for Xen, shared between threads: the frontend model writes to the
//! same pages the backend reads.

pub mod wire;
