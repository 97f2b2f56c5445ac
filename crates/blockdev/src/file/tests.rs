use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

use super::*;

/// A fresh directory for one test.
pub(super) fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vnvme-file-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(super) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn created_file_round_trips_aligned_io_through_o_direct() {
    let dir = temp_dir("aligned");
    let dev = FileDevice::open(dir.join("ns.img"), Some(1 << 20)).unwrap();
    assert_eq!(dev.size(), 1 << 20);
    assert!(dev.volatile_cache());
    let data = pattern(1, 3 * 4096);
    dev.write(8192, &data).unwrap();
    dev.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    dev.read(8192, &mut back).unwrap();
    assert_eq!(back, data);
    let c = dev.counters();
    assert_eq!(c.flushes, 1);
    if dev.direct_io() {
        assert_eq!((c.direct_ops, c.buffered_ops), (2, 0), "{c:?}");
    } else {
        eprintln!("note: {} has no O_DIRECT: buffered only", dir.display());
    }
    // Never written: zeroes.
    dev.read(0, &mut back[..8192]).unwrap();
    assert!(back[..8192].iter().all(|&b| b == 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unaligned_io_goes_through_the_page_cache_and_stays_coherent() {
    let dir = temp_dir("unaligned");
    let dev = FileDevice::open(dir.join("ns.img"), Some(64 * 1024)).unwrap();
    // Aligned write, then an unaligned overwrite in its middle, then an
    // aligned read must see both.
    dev.write(0, &pattern(2, 16384)).unwrap();
    dev.write(4096 + 512, &pattern(3, 1000)).unwrap();
    let mut back = vec![0u8; 16384];
    dev.read(0, &mut back).unwrap();
    let mut expect = pattern(2, 16384);
    expect[4608..5608].copy_from_slice(&pattern(3, 1000));
    assert_eq!(back, expect);
    let mut small = vec![0u8; 1000];
    dev.read(4608, &mut small).unwrap();
    assert_eq!(small, pattern(3, 1000));
    assert_eq!(dev.counters().buffered_ops, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fua_write_is_a_dsync_write_and_reads_back() {
    let dir = temp_dir("fua");
    let dev = FileDevice::open(dir.join("ns.img"), Some(1 << 20)).unwrap();
    dev.write_fua(4096, &pattern(4, 8192)).unwrap();
    dev.write_fua(100, &pattern(5, 10)).unwrap();
    assert_eq!(dev.counters().dsync_writes, 2);
    assert_eq!(dev.counters().flushes, 0);
    let mut back = vec![0u8; 8192];
    dev.read(4096, &mut back).unwrap();
    assert_eq!(back, pattern(4, 8192));
    // The data is in the file, as another reader sees it.
    let raw = std::fs::read(dir.join("ns.img")).unwrap();
    assert_eq!(&raw[100..110], &pattern(5, 10)[..]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn large_transfers_are_split_and_reassembled() {
    let dir = temp_dir("large");
    let dev = FileDevice::open(dir.join("ns.img"), Some(4 << 20)).unwrap();
    let data = pattern(6, MAX_IO * 2 + 8192);
    dev.write(4096, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    dev.read(4096, &mut back).unwrap();
    assert_eq!(back, data);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn discard_punches_a_hole_that_reads_as_zeroes() {
    let dir = temp_dir("discard");
    let path = dir.join("ns.img");
    let dev = FileDevice::open(&path, Some(1 << 20)).unwrap();
    dev.write(0, &pattern(7, 1 << 20)).unwrap();
    dev.flush().unwrap();
    let allocated = std::fs::metadata(&path).unwrap().blocks();
    dev.discard(64 * 1024, 512 * 1024).unwrap();
    let mut back = vec![0u8; 1 << 20];
    dev.read(0, &mut back).unwrap();
    let full = pattern(7, 1 << 20);
    assert_eq!(back[..65536], full[..65536]);
    assert!(back[65536..65536 + 524288].iter().all(|&b| b == 0));
    assert_eq!(back[65536 + 524288..], full[65536 + 524288..]);
    let c = dev.counters();
    if c.holes_punched == 1 {
        let after = std::fs::metadata(&path).unwrap().blocks();
        assert!(
            after < allocated,
            "{after} blocks after, {allocated} before"
        );
    } else {
        eprintln!("note: no hole punching here: discard wrote zeroes ({c:?})");
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn write_zeroes_zeroes_exactly_the_range() {
    let dir = temp_dir("zeroes");
    let dev = FileDevice::open(dir.join("ns.img"), Some(64 * 1024)).unwrap();
    dev.write(0, &[0xAB; 65536]).unwrap();
    dev.write_zeroes(4096, 8192).unwrap();
    let mut back = vec![0u8; 65536];
    dev.read(0, &mut back).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0xAB));
    assert!(back[4096..12288].iter().all(|&b| b == 0));
    assert!(back[12288..].iter().all(|&b| b == 0xAB));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn out_of_range_requests_fail_without_touching_the_file() {
    let dir = temp_dir("range");
    let dev = FileDevice::open(dir.join("ns.img"), Some(8192)).unwrap();
    assert!(dev.read(8192, &mut [0u8; 1]).is_err());
    assert!(dev.write(4096, &[0u8; 4097]).is_err());
    assert!(dev.write_fua(u64::MAX, &[0u8; 2]).is_err());
    assert!(dev.discard(0, u64::MAX).is_err());
    assert!(dev.write_zeroes(8191, 2).is_err());
    assert_eq!(std::fs::metadata(dir.join("ns.img")).unwrap().len(), 8192);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_callers_each_get_a_ring() {
    let dir = temp_dir("concurrent");
    let dev = std::sync::Arc::new(FileDevice::open(dir.join("ns.img"), Some(4 << 20)).unwrap());
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let dev = &dev;
            s.spawn(move || {
                for i in 0..32u64 {
                    let off = (u64::from(t) * 32 + i) * 4096;
                    dev.write(off, &[t + 1; 4096]).unwrap();
                    let mut back = [0u8; 4096];
                    dev.read(off, &mut back).unwrap();
                    assert!(back.iter().all(|&b| b == t + 1));
                }
            });
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_open_is_refused_while_the_first_holds_the_lock() {
    let dir = temp_dir("lock");
    let path = dir.join("ns.img");
    let first = FileDevice::open(&path, Some(8192)).unwrap();
    let err = FileDevice::open(&path, None).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, FileError::Locked(_)), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("in use by another vnvme"), "{msg}");
    drop(first);
    FileDevice::open(&path, None).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sizes_are_checked_against_the_file() {
    let dir = temp_dir("sizes");
    let path = dir.join("ns.img");
    let missing = FileDevice::open(&path, None).unwrap_err();
    assert!(missing.to_string().contains("does not exist"), "{missing}");

    std::fs::write(&path, [1u8; 100]).unwrap();
    let small = FileDevice::open(&path, None).unwrap_err();
    assert_eq!(
        small.to_string(),
        format!(
            "{} is 100 bytes: a namespace needs a non-zero multiple of 4096 bytes",
            path.display()
        )
    );
    let odd = FileDevice::open(&path, Some(6000)).unwrap_err();
    assert!(odd.to_string().contains("multiple of 4096"), "{odd}");

    // A size extends a smaller file, sparsely, keeping its contents.
    let dev = FileDevice::open(&path, Some(16384)).unwrap();
    assert_eq!(dev.size(), 16384);
    let mut head = [0u8; 100];
    dev.read(0, &mut head).unwrap();
    assert_eq!(head, [1u8; 100]);
    drop(dev);
    // A smaller size serves the start of a larger file and leaves it alone.
    let dev = FileDevice::open(&path, Some(8192)).unwrap();
    assert_eq!(dev.size(), 8192);
    drop(dev);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 16384);
    assert_eq!(FileDevice::open(&path, None).unwrap().size(), 16384);

    let not_a_file = FileDevice::open(&dir, None).unwrap_err();
    assert!(matches!(not_a_file, FileError::NotAFile(_)), "{not_a_file}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_read_only_file_is_reported_as_not_writable() {
    let dir = temp_dir("readonly");
    let path = dir.join("ns.img");
    std::fs::write(&path, vec![0u8; 8192]).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    if rustix::process::geteuid().is_root() {
        eprintln!(
            "note: running as root, file modes are not enforced: checking the EACCES mapping only"
        );
        let err = open_error(&path, io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(
            err.to_string(),
            format!("{} is not writable", path.display())
        );
    } else {
        let err = FileDevice::open(&path, None).unwrap_err();
        assert!(matches!(err, FileError::NotWritable(..)), "{err}");
        assert!(err.to_string().contains("is not writable"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A loop device over a file, detached on drop.
struct LoopDevice(PathBuf);

impl LoopDevice {
    fn attach(backing: &Path) -> Result<Self, String> {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(Self(PathBuf::from(
            String::from_utf8_lossy(&out.stdout).trim(),
        )))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

#[test]
fn block_device_round_trip_and_exclusive_open() {
    let dir = temp_dir("blockdev");
    let backing = dir.join("backing.img");
    std::fs::write(&backing, vec![0x5Au8; 4 << 20]).unwrap();
    let dev_path = match LoopDevice::attach(&backing) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("SKIPPED block_device_round_trip_and_exclusive_open: no loop device ({e})");
            return;
        }
    };
    let dev = FileDevice::open(&dev_path.0, None).unwrap();
    assert!(dev.is_block_device());
    assert_eq!(dev.size(), 4 << 20);
    let data = pattern(8, 8192);
    dev.write(4096, &data).unwrap();
    dev.write_fua(16384, &data).unwrap();
    dev.flush().unwrap();
    let mut back = vec![0u8; 8192];
    dev.read(4096, &mut back).unwrap();
    assert_eq!(back, data);
    dev.discard(65536, 65536).unwrap();
    dev.read(65536, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "discarded range reads zeroes");
    dev.read(0, &mut back[..4096]).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0x5A));

    let again = FileDevice::open(&dev_path.0, None).unwrap_err();
    assert!(
        matches!(again, FileError::Busy(_) | FileError::Locked(_)),
        "{again}"
    );
    let bigger = FileDevice::open(&dev_path.0, Some(8 << 20));
    drop(dev);
    assert!(bigger.is_err());
    let err = FileDevice::open(&dev_path.0, Some(8 << 20)).unwrap_err();
    assert!(matches!(err, FileError::TooSmall { .. }), "{err}");
    assert!(err
        .to_string()
        .contains("smaller than the 8388608 bytes requested"));
    drop(dev_path);
    let _ = std::fs::remove_dir_all(&dir);
}
