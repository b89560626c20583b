//! Board and writer tests.
