//! Integration tests of health-csi over real unix sockets in temp dirs.
//!
//! One test binary with modules rather than one binary per file: each binary
//! links tonic, hyper and the test driver again, which cost about a minute of
//! build time per file on the project's 2-core machines.

mod capabilities;
mod controller;
mod driver_process;
mod driver_set;
mod hostile;
mod node;
mod proxy;
