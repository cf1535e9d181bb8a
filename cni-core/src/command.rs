//! The CNI operations (`CNI_COMMAND`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, code};

/// A CNI operation, as passed to a plugin in `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Command {
    /// Attach a container to a network.
    Add,
    /// Detach a container from a network.
    Del,
    /// Verify that an attachment is as it should be (0.4.0 and later).
    Check,
    /// Whether the plugin is ready to service ADD requests (1.1.0 and later).
    Status,
    /// Clean up resources of attachments that are no longer valid (1.1.0 and later).
    Gc,
    /// Report the versions the plugin supports.
    Version,
}

impl Command {
    /// Every command.
    pub const ALL: [Command; 6] = [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Status,
        Command::Gc,
        Command::Version,
    ];

    /// The value of `CNI_COMMAND`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }

    /// Whether the command acts on one attachment (container, netns, ifname):
    /// ADD, DEL and CHECK. STATUS, GC and VERSION act on the network or plugin.
    pub fn is_attachment_command(&self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Command {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Command::ALL
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| Error::InvalidParameter {
                field: "command",
                value: s.to_owned(),
                reason: "expected one of ADD, DEL, CHECK, STATUS, GC, VERSION".into(),
                code: code::INVALID_ENVIRONMENT_VARIABLES,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for c in Command::ALL {
            assert_eq!(c.as_str().parse::<Command>().unwrap(), c);
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{c}\""));
        }
        assert_eq!("del".parse::<Command>().unwrap(), Command::Del);
        assert!("REMOVE".parse::<Command>().is_err());
    }
}
