//! A small tmpfs over a test's dir: [`cni_test_support::tmpfs`].

pub use cni_test_support::tmpfs::Tmpfs;
