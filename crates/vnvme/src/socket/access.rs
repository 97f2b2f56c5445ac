//! Who may connect to a socket the server makes: its mode and group.
//!
//! Connecting to a UNIX socket needs write permission on its file (and
//! search permission on every folder above it), so the mode's `w` bits
//! are what let a user in.

use nix::unistd::{Gid, Group, Uid, User};

/// Permissions given to a socket file when it is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// Permission bits (0o777 at most).
    pub mode: u32,
    /// The group it is given to; `None` keeps the one it is created with
    /// (the server's, or its folder's if that has the set-group-ID bit).
    pub group: Option<SocketGroup>,
}

/// A group the socket is given to: its id, and its name for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketGroup {
    pub gid: u32,
    pub name: String,
}

/// The vfio-user socket's mode when none is given: its user only, or its
/// user and group when a group is given (what `--socket-group` is for).
pub const DEFAULT_MODE: u32 = 0o600;
pub const DEFAULT_GROUP_MODE: u32 = 0o660;

impl Access {
    /// `mode` (or the default for whether a group is given) and `group`.
    pub fn new(mode: Option<u32>, group: Option<SocketGroup>) -> Self {
        let default = if group.is_some() {
            DEFAULT_GROUP_MODE
        } else {
            DEFAULT_MODE
        };
        Self {
            mode: mode.unwrap_or(default),
            group,
        }
    }
}

/// A file mode in octal (`600`, `0660`). A mode without any `w` bit is
/// refused: nobody could connect.
pub fn parse_mode(text: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(text, 8)
        .ok()
        .filter(|&m| m <= 0o777)
        .ok_or_else(|| {
            format!("invalid mode '{text}': give octal permissions such as 600 or 660")
        })?;
    if mode & 0o222 == 0 {
        return Err(format!(
            "mode {text} lets nobody connect (connecting to a socket needs write permission): \
             give e.g. 600 or 660"
        ));
    }
    Ok(mode)
}

/// A group given by name or number (`kvm`, `libvirt-qemu`, `107`).
pub fn resolve_group(text: &str) -> Result<SocketGroup, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("the socket group is empty: give a group name or number".into());
    }
    if let Ok(gid) = text.parse::<u32>() {
        // A number need not name a group in the group database.
        return Ok(SocketGroup {
            gid,
            name: group_name(gid),
        });
    }
    match Group::from_name(text) {
        Ok(Some(g)) => Ok(SocketGroup {
            gid: g.gid.as_raw(),
            name: g.name,
        }),
        Ok(None) => Err(format!(
            "no group '{text}' (getent group {text} finds none): give an existing group's name \
             or number"
        )),
        Err(e) => Err(format!("looking up group '{text}': {e}")),
    }
}

/// A group's name, or its number where it has none.
pub fn group_name(gid: u32) -> String {
    match Group::from_gid(Gid::from_raw(gid)) {
        Ok(Some(g)) => g.name,
        _ => gid.to_string(),
    }
}

/// A user's name, or its number where it has none.
pub fn user_name(uid: u32) -> String {
    match User::from_uid(Uid::from_raw(uid)) {
        Ok(Some(u)) => u.name,
        _ => uid.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_and_must_let_someone_write() {
        assert_eq!(parse_mode("660"), Ok(0o660));
        assert_eq!(parse_mode("0600"), Ok(0o600));
        assert!(parse_mode("888").unwrap_err().contains("octal"));
        assert!(parse_mode("1777").unwrap_err().contains("octal"));
        assert!(parse_mode("444").unwrap_err().contains("write permission"));
    }

    #[test]
    fn the_default_mode_follows_the_group() {
        assert_eq!(Access::new(None, None).mode, 0o600);
        let g = resolve_group("0").unwrap();
        assert_eq!(g.name, "root");
        assert_eq!(Access::new(None, Some(g.clone())).mode, 0o660);
        assert_eq!(Access::new(Some(0o600), Some(g)).mode, 0o600);
    }

    #[test]
    fn groups_resolve_by_name_or_number() {
        assert_eq!(resolve_group("root").unwrap().gid, 0);
        assert_eq!(resolve_group("4242424").unwrap().name, "4242424");
        let e = resolve_group("no-such-group-vnvme").unwrap_err();
        assert!(e.contains("no group 'no-such-group-vnvme'"), "{e}");
    }
}
