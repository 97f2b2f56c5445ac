//! The syntax of a namespace description (`--ns`, `bench init --ns`, the
//! control socket's `namespace_add`): its storage forms and options as the
//! help and the errors write them.
//!
//! [`NamespaceSpec`](crate::namespace::NamespaceSpec)'s parser refuses an
//! option whose key is not listed here ([`is_option`]), and the tests find
//! every listed form and option in `vnvme serve --help` and `vnvme bench
//! init --help` and parse an example of each: an option cannot be added
//! without its help.

use crate::qos::NS_QOS_OPTIONS;
use crate::zoned_options::ZONED_OPTIONS;

/// The storage, the part before the first comma.
pub const NS_FORMS: &[&str] = &[
    "SIZE[:null|ram]",
    "PATH:file",
    "SIZE:file=PATH",
    "nbd=URI",
    "SIZE:nbd=URI",
];

/// The options after the storage, but the zoned ones ([`ZONED_OPTIONS`]):
/// the key, then `=` and what its value is, if it takes one.
pub const NS_OPTIONS: &[&str] = &[
    "ready=DURATION",
    "never-ready",
    "detached",
    "format=N",
    "pi=1|2|3",
    "pil=first|last",
    "vwc",
    "nguid=HEX",
    "eui64=HEX",
    "uuid=UUID",
];

/// The help of `--ns`, shared by `vnvme serve` and `vnvme bench init`. It
/// names every entry of [`NS_FORMS`], [`NS_OPTIONS`] and [`ZONED_OPTIONS`]
/// as written there (the tests check it).
pub const NS_HELP: &str = "\
A namespace; repeat for more (NSIDs are given in order from 1). Storage, before the first comma:
  SIZE[:null|ram]  ram (the default) keeps the data in memory (a memfd, which a live upgrade
                   and --supervise after a crash pass on) for the life of the server; null reads
                   zeroes and drops writes.
                   SIZE: bytes, or with K, M, G, T (1G)
  PATH:file        a file or block device, of its own size (io_uring, locked while served)
  SIZE:file=PATH   a file, created or extended to SIZE
  nbd=URI          an NBD export, of its own size: nbd://HOST[:PORT]/EXPORT or
                   nbd+unix:///EXPORT?socket=PATH (no TLS)
  SIZE:nbd=URI     the first SIZE bytes of an NBD export
Options, each after a comma:
  ready=DURATION   Namespace Not Ready for DURATION after each enable (250ms, 5s, 1m)
  never-ready      never ready (commands get Namespace Not Ready, with DNR after --ready-timeout)
  detached         allocated but not attached at start (Namespace Attachment attaches it)
  format=N         LBA format index; default 3 (4096-byte blocks), but a file or nbd image with
                   a partition table gets the sector size it was made for (0: 512-byte blocks,
                   or 3 if its GPT header is at byte 4096; the choice is logged)
  pi=1|2|3         protection information type (needs a format with metadata: 1, 2, 4-7)
  pil=first|last   where the protection information lies in the metadata (default last)
  vwc              ram only: a volatile write cache, which a power-loss fault empties
  nguid=HEX        the NGUID (32 hex digits, dashes allowed) instead of the derived one
  eui64=HEX        the EUI-64 (16 hex digits, colons allowed) instead of the derived one
  uuid=UUID        the UUID (32 hex digits, dashes allowed) instead of the derived one
  zoned            a zoned namespace (Zoned Namespace Command Set), with:
  zone-size=SIZE   zone size, a power of two (default 64M)
  zone-cap=SIZE    writable part of each zone (default the zone size)
  max-open=N       open zones at most (default no limit)
  max-active=N     open or closed zones at most (default max-open)
  ro-zones=N       the last N zones start read only
  zone-ext=BYTES   zone descriptor extension size, a multiple of 64 up to 16320
  iops=N           at most N reads and writes a second (a token bucket, burst a tenth of N;
                   bursts and more in the configuration's qos tables, see docs/qos.md)
  read-iops=N      at most N reads a second
  write-iops=N     at most N writes a second
  bps=SIZE         at most SIZE bytes read and written a second (50M)
  read-bps=SIZE    at most SIZE bytes read a second
  write-bps=SIZE   at most SIZE bytes written a second
  qos-group=NAME   shares the budget of [qos_groups.NAME] of --config with its other members
Example: --ns 1G --ns /srv/vm1.img:file,format=0 --ns 4G:nbd=nbd://127.0.0.1/vm2,ready=2s";

/// `-h`'s line for `--ns`: the storage forms, and `default`, the
/// namespaces without `--ns`.
pub fn short_help(default: &str) -> String {
    format!(
        "A namespace: {}, then options after commas (--help lists them); repeat for more. \
         Default: {default}",
        NS_FORMS.join(", ")
    )
}

/// `--help`'s text for `--ns`: [`NS_HELP`], and `default`, the namespaces
/// without `--ns`.
pub fn long_help(default: &str) -> String {
    format!("{NS_HELP}\nDefault: {default}")
}

/// An option's key: what comes before `=`, or all of it.
fn key(option: &str) -> &str {
    option.split_once('=').map_or(option, |(key, _)| key)
}

/// Whether `option` (`key` or `key=value`) has a key that [`NS_OPTIONS`]
/// or [`ZONED_OPTIONS`] lists.
pub fn is_option(option: &str) -> bool {
    let k = key(option);
    NS_OPTIONS
        .iter()
        .chain(ZONED_OPTIONS)
        .chain(NS_QOS_OPTIONS)
        .any(|o| key(o) == k)
}

/// The error for an option that is none of them, or whose key is one but
/// whose form is not (`vwc=1`).
pub fn unknown_option(option: &str) -> String {
    format!(
        "unknown namespace option '{option}': use {}, {}, or zoned with {} (see vnvme serve --help)",
        NS_OPTIONS.join(", "),
        NS_QOS_OPTIONS.join(", "),
        ZONED_OPTIONS
            .iter()
            .filter(|o| **o != "zoned")
            .copied()
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The error for storage that is none of [`NS_FORMS`].
pub fn unknown_storage(what: &str) -> String {
    format!(
        "unknown backend '{what}': a namespace's storage is one of {} (see vnvme serve --help)",
        NS_FORMS.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::{Backend, NamespaceSpec};

    /// A namespace that uses each option, by the option's form.
    const OPTION_EXAMPLES: &[(&str, &str)] = &[
        ("ready=DURATION", "1M,ready=1s"),
        ("never-ready", "1M,never-ready"),
        ("detached", "1M,detached"),
        ("format=N", "1M,format=1"),
        ("pi=1|2|3", "1M,format=1,pi=1"),
        ("pil=first|last", "1M,format=1,pi=1,pil=first"),
        ("vwc", "1M:ram,vwc"),
        ("nguid=HEX", "1M,nguid=00112233445566778899aabbccddeeff"),
        ("eui64=HEX", "1M,eui64=02:00:00:00:00:00:00:2a"),
        ("uuid=UUID", "1M,uuid=9a5e2a4e-3c1b-4a8f-8f4e-2b1d6c7e8f90"),
        ("zoned", "256M,zoned"),
        ("zone-size=SIZE", "256M,zoned,zone-size=16M"),
        ("zone-cap=SIZE", "256M,zoned,zone-cap=32M"),
        ("max-open=N", "256M,zoned,max-open=2"),
        ("max-active=N", "256M,zoned,max-active=3"),
        ("ro-zones=N", "256M,zoned,ro-zones=1"),
        ("zone-ext=BYTES", "256M,zoned,zone-ext=64"),
        ("iops=N", "1M,iops=1000"),
        ("read-iops=N", "1M,read-iops=1000"),
        ("write-iops=N", "1M,write-iops=1000"),
        ("bps=SIZE", "1M,bps=50M"),
        ("read-bps=SIZE", "1M,read-bps=50M"),
        ("write-bps=SIZE", "1M,write-bps=50M"),
        ("qos-group=NAME", "1M,qos-group=tenant-a"),
    ];

    #[test]
    fn every_listed_option_is_one_the_parser_takes() {
        let listed: Vec<&str> = NS_OPTIONS
            .iter()
            .chain(ZONED_OPTIONS)
            .chain(NS_QOS_OPTIONS)
            .copied()
            .collect();
        let examples: Vec<&str> = OPTION_EXAMPLES.iter().map(|(o, _)| *o).collect();
        assert_eq!(
            listed, examples,
            "an example for each listed option, in order"
        );
        for (option, spec) in OPTION_EXAMPLES {
            let parsed = spec.parse::<NamespaceSpec>();
            assert!(parsed.is_ok(), "{option}: {spec}: {parsed:?}");
            assert_ne!(
                parsed,
                spec.rsplit_once(',').unwrap().0.parse(),
                "{option} changes nothing in {spec}"
            );
        }
    }

    #[test]
    fn an_unlisted_option_is_refused_with_the_list() {
        for bad in ["1M,fast", "1M,vwc=1", "1M,never-ready=yes", "1M,zoned=1"] {
            let e = bad.parse::<NamespaceSpec>().unwrap_err();
            assert!(e.contains("unknown namespace option"), "{bad}: {e}");
            assert!(
                e.contains("uuid=UUID") && e.contains("zone-ext=BYTES"),
                "{e}"
            );
        }
    }

    #[test]
    fn every_backend_has_its_forms_listed() {
        for (spec, want) in [
            ("1M", Backend::Ram),
            ("1M:ram", Backend::Ram),
            ("1M:null", Backend::Null),
            ("/srv/a.img:file", Backend::File("/srv/a.img".into())),
            ("1M:file=/srv/a.img", Backend::File("/srv/a.img".into())),
            ("nbd=nbd://h/e", Backend::Nbd("nbd://h/e".into())),
            ("1M:nbd=nbd://h/e", Backend::Nbd("nbd://h/e".into())),
        ] {
            let got = spec.parse::<NamespaceSpec>().unwrap().backend;
            assert_eq!(got, want, "{spec}");
            for form in got.forms() {
                assert!(NS_FORMS.contains(form), "{form} of {got:?}");
            }
        }
        let e = "1M:disk".parse::<NamespaceSpec>().unwrap_err();
        assert!(e.contains("SIZE:nbd=URI"), "{e}");
    }

    #[test]
    fn the_help_names_every_form_and_option() {
        for form in NS_FORMS
            .iter()
            .chain(NS_OPTIONS)
            .chain(ZONED_OPTIONS)
            .chain(NS_QOS_OPTIONS)
        {
            assert!(NS_HELP.contains(form), "{form}");
        }
    }
}
