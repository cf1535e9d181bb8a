//! Who may talk to the daemon: the peer credentials of each connection
//! (`SO_PEERCRED`, taken by the kernel at `connect`, so they cannot be
//! forged) against allowed uids and gids.
//!
//! Root (uid 0) is always allowed. The socket's mode (0660, group
//! configurable) is the first gate; this is the second, so a socket made
//! reachable by mistake (or a socket-activated one with looser permissions)
//! still refuses everyone else with HTTP 403.
//!
//! # Caveats
//! Only the peer's primary gid is known from `SO_PEERCRED`; supplementary
//! groups are not considered. Allow such users by uid.

/// The allowed peers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerPolicy {
    /// Allowed uids besides root.
    pub uids: Vec<u32>,
    /// Allowed primary gids.
    pub gids: Vec<u32>,
}

impl PeerPolicy {
    /// Root only.
    pub fn root_only() -> Self {
        PeerPolicy::default()
    }

    /// Whether a peer with this uid and primary gid may use the API.
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        uid == 0 || self.uids.contains(&uid) || self.gids.contains(&gid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_always_others_by_list() {
        let p = PeerPolicy::root_only();
        assert!(p.allows(0, 0));
        assert!(p.allows(0, 1000));
        assert!(!p.allows(1000, 1000));
        let p = PeerPolicy {
            uids: vec![1000],
            gids: vec![50],
        };
        assert!(p.allows(1000, 1));
        assert!(p.allows(7, 50));
        assert!(!p.allows(7, 51));
    }
}
