//! Fake plugins: real executables written into a test temp dir.
