//! HTTP/1.1 on the Unix socket: the only part of the daemon that speaks
//! HTTP.

pub(crate) mod conns;
pub(crate) mod routes;
