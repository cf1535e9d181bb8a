//! Results of every version and conversion between them (in progress).
