//! What QEMU 11.1's `vfio-user-pci` sends while it realizes the device and
//! SeaBIOS probes it, replayed byte for byte against the NVMe device over a
//! socketpair: every request must succeed, and the answers QEMU depends on
//! (5 IRQ indexes, a config region with a size, BAR0 size) must hold.
//!
//! The messages were recorded with `vnvme -vv serve` (one trace line per
//! request) under the guest rig (`tests/guest/`). To refresh them, boot a
//! guest and take the `request` lines of the first connection. Only VERSION
//! is rebuilt here (its JSON is longer than the trace shows).

use std::io::Read;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use vnvme::device::DeviceOptions;
use vnvme::namespace::NamespaceSpec;

const HEADER_SIZE: usize = 16;
const TYPE_REPLY: u32 = 1;
const NO_REPLY: u32 = 1 << 4;
const ERROR: u32 = 1 << 5;
const DMA_MAP: u16 = 2;
const DMA_UNMAP: u16 = 3;
const REGION_WRITE: u16 = 10;

/// (msg_id, command, fds, posted, payload) as QEMU 11.1 sent them after
/// VERSION (msg_id 0): pipelined DMA_MAPs with and without fds, device and
/// region info, config space sizing, SET_IRQS for INTx/ERR, DEVICE_RESET,
/// firmware DMA map churn, SeaBIOS enabling the controller with posted BAR0
/// writes, and INTx unmasks.
#[rustfmt::skip]
const QEMU_SEQUENCE: &[(u16, u16, usize, bool, &str)] = &[
    (1, 2, 1, false, "20000000030000000000000000000000000000000000000000000a0000000000"),
    (2, 2, 1, false, "200000000300000000000c000000000000000c00000000000000f43f00000000"),
    (3, 2, 0, false, "200000000100000000000000000000000000fcff000000000000040000000000"),
    (4, 4, 0, false, "10000000000000000000000000000000"),
    (5, 5, 0, false, "2000000000000000000000000000000000000000000000000000000000000000"),
    (6, 5, 0, false, "2000000000000000010000000000000000000000000000000000000000000000"),
    (7, 5, 0, false, "2000000000000000020000000000000000000000000000000000000000000000"),
    (8, 5, 0, false, "2000000000000000030000000000000000000000000000000000000000000000"),
    (9, 5, 0, false, "2000000000000000040000000000000000000000000000000000000000000000"),
    (10, 5, 0, false, "2000000000000000050000000000000000000000000000000000000000000000"),
    (11, 5, 0, false, "2000000000000000070000000000000000000000000000000000000000000000"),
    (12, 7, 0, false, "10000000000000000300000000000000"),
    (13, 9, 0, false, "00000000000000000700000000100000"),
    (14, 9, 0, false, "30000000000000000700000004000000"),
    (15, 10, 0, false, "3000000000000000070000000400000000f8ffff"),
    (16, 9, 0, false, "30000000000000000700000004000000"),
    (17, 10, 0, false, "3000000000000000070000000400000000000000"),
    (18, 9, 0, false, "10000000000000000700000004000000"),
    (19, 9, 0, false, "52000000000000000700000002000000"),
    (20, 9, 0, false, "54000000000000000700000004000000"),
    (21, 9, 0, false, "58000000000000000700000004000000"),
    (22, 7, 0, false, "10000000000000000200000000000000"),
    (23, 9, 0, false, "3d000000000000000700000001000000"),
    (24, 9, 0, false, "3d000000000000000700000001000000"),
    (25, 8, 1, false, "1400000024000000000000000000000001000000"),
    (26, 8, 1, false, "1400000024000000030000000000000001000000"),
    (27, 8, 0, false, "1400000021000000000000000000000000000000"),
    (28, 9, 0, false, "04000000000000000700000002000000"),
    (29, 10, 0, false, "040000000000000007000000020000000000"),
    (30, 9, 0, false, "44000000000000000700000002000000"),
    (31, 13, 0, false, ""),
    (32, 9, 0, false, "3d000000000000000700000001000000"),
    (33, 8, 1, false, "1400000024000000000000000000000001000000"),
    (34, 10, 0, false, "1000000000000000070000000400000000000000"),
    (35, 10, 0, false, "1400000000000000070000000400000000000000"),
    (36, 10, 0, false, "1800000000000000070000000400000000000000"),
    (37, 10, 0, false, "1c00000000000000070000000400000000000000"),
    (38, 10, 0, false, "2000000000000000070000000400000000000000"),
    (39, 10, 0, false, "2400000000000000070000000400000000000000"),
    (40, 3, 0, false, "180000000000000000000c00000000000000f43f00000000"),
    (41, 2, 0, false, "2000000001000000000000000000000000000c00000000000000020000000000"),
    (42, 2, 0, false, "2000000001000000000000000000000000000e00000000000000020000000000"),
    (43, 2, 1, false, "2000000003000000000010000000000000001000000000000000f03f00000000"),
    (44, 3, 0, false, "180000000000000000000c00000000000000020000000000"),
    (45, 3, 0, false, "180000000000000000000e00000000000000020000000000"),
    (46, 3, 0, false, "180000000000000000001000000000000000f03f00000000"),
    (47, 2, 1, false, "200000000300000000000c000000000000000c00000000000080010000000000"),
    (48, 2, 0, false, "2000000001000000000000000000000000800d00000000000080000000000000"),
    (49, 2, 0, false, "2000000001000000000000000000000000000e00000000000000010000000000"),
    (50, 2, 1, false, "200000000300000000000f000000000000000f00000000000000f13f00000000"),
    (51, 3, 0, false, "180000000000000000000c00000000000080010000000000"),
    (52, 3, 0, false, "180000000000000000800d00000000000080000000000000"),
    (53, 3, 0, false, "180000000000000000000e00000000000000010000000000"),
    (54, 3, 0, false, "180000000000000000000f00000000000000f13f00000000"),
    (55, 2, 1, false, "200000000300000000000c000000000000000c00000000000000f43f00000000"),
    (56, 9, 0, false, "00000000000000000700000002000000"),
    (57, 9, 0, false, "0a000000000000000700000002000000"),
    (58, 9, 0, false, "0e000000000000000700000001000000"),
    (59, 9, 0, false, "00000000000000000700000002000000"),
    (60, 9, 0, false, "0a000000000000000700000002000000"),
    (61, 9, 0, false, "0e000000000000000700000001000000"),
    (62, 9, 0, false, "00000000000000000700000002000000"),
    (63, 9, 0, false, "00000000000000000700000004000000"),
    (64, 9, 0, false, "08000000000000000700000004000000"),
    (65, 9, 0, false, "0e000000000000000700000001000000"),
    (66, 9, 0, false, "0e000000000000000700000001000000"),
    (67, 10, 0, false, "10000000000000000700000004000000ffffffff"),
    (68, 10, 0, false, "1000000000000000070000000400000004000000"),
    (69, 10, 0, false, "14000000000000000700000004000000ffffffff"),
    (70, 10, 0, false, "1400000000000000070000000400000000000000"),
    (71, 10, 0, false, "18000000000000000700000004000000ffffffff"),
    (72, 10, 0, false, "1800000000000000070000000400000000000000"),
    (73, 10, 0, false, "1c000000000000000700000004000000ffffffff"),
    (74, 10, 0, false, "1c00000000000000070000000400000000000000"),
    (75, 10, 0, false, "20000000000000000700000004000000ffffffff"),
    (76, 10, 0, false, "2000000000000000070000000400000000000000"),
    (77, 10, 0, false, "24000000000000000700000004000000ffffffff"),
    (78, 10, 0, false, "2400000000000000070000000400000000000000"),
    (79, 10, 0, false, "3000000000000000070000000400000000f8ffff"),
    (80, 10, 0, false, "3000000000000000070000000400000000000000"),
    (81, 10, 0, false, "100000000000000007000000040000000040bdfe"),
    (82, 10, 0, false, "1400000000000000070000000400000000000000"),
    (83, 2, 0, false, "20000000030000000000000000000000000000fd000000000000000100000000"),
    (84, 9, 0, false, "3d000000000000000700000001000000"),
    (85, 10, 0, false, "3c0000000000000007000000010000000b"),
    (86, 9, 0, false, "04000000000000000700000002000000"),
    (87, 10, 0, false, "040000000000000007000000020000000301"),
    (88, 3, 0, false, "1800000000000000000000000000000000000a0000000000"),
    (89, 3, 0, false, "180000000000000000000c00000000000000f43f00000000"),
    (90, 2, 1, false, "2000000003000000000000000000000000000000000000000000004000000000"),
    (91, 3, 0, false, "180000000000000000000000000000000000004000000000"),
    (92, 2, 1, false, "20000000030000000000000000000000000000000000000000000a0000000000"),
    (93, 2, 1, false, "200000000300000000000c000000000000000c00000000000000f43f00000000"),
    (94, 9, 0, false, "3d000000000000000700000001000000"),
    (95, 9, 0, false, "3c000000000000000700000001000000"),
    (96, 2, 0, false, "200000000100000000000000000000000000bcfe000000000000010000000000"),
    (97, 3, 0, false, "18000000000000000000bcfe000000000000010000000000"),
    (98, 9, 0, false, "04000000000000000700000002000000"),
    (99, 10, 0, false, "040000000000000007000000020000000201"),
    (100, 9, 0, false, "08000000000000000000000004000000"),
    (101, 9, 0, false, "00000000000000000000000004000000"),
    (102, 9, 0, false, "04000000000000000000000004000000"),
    (103, 9, 0, false, "04000000000000000700000002000000"),
    (104, 10, 0, false, "040000000000000007000000020000000601"),
    (105, 10, 0, true, "1400000000000000000000000400000000000000"),
    (106, 9, 0, false, "04000000000000000000000004000000"),
    (107, 9, 0, false, "00000000000000000000000004000000"),
    (108, 9, 0, false, "1c000000000000000000000004000000"),
    (109, 9, 0, false, "04000000000000000000000004000000"),
    (110, 9, 0, false, "00000000000000000000000004000000"),
    (111, 10, 0, true, "240000000000000000000000040000003f00ff00"),
    (112, 10, 0, true, "2800000000000000000000000400000000d0fd3f"),
    (113, 10, 0, true, "2c00000000000000000000000400000000000000"),
    (114, 10, 0, true, "3000000000000000000000000400000000e0fd3f"),
    (115, 10, 0, true, "3400000000000000000000000400000000000000"),
    (116, 10, 0, true, "1400000000000000000000000400000001004600"),
    (117, 9, 0, false, "04000000000000000000000004000000"),
    (118, 9, 0, false, "00000000000000000000000004000000"),
    (119, 9, 0, false, "1c000000000000000000000004000000"),
    (120, 10, 0, true, "0010000000000000000000000400000001000000"),
    (121, 10, 0, true, "0410000000000000000000000400000001000000"),
    (122, 8, 0, false, "1400000011000000000000000000000001000000"),
    (123, 9, 0, false, "04000000000000000000000004000000"),
    (124, 9, 0, false, "00000000000000000000000004000000"),
    (125, 10, 0, true, "0010000000000000000000000400000002000000"),
    (126, 10, 0, true, "0410000000000000000000000400000002000000"),
    (127, 9, 0, false, "04000000000000000000000004000000"),
    (128, 9, 0, false, "00000000000000000000000004000000"),
    (129, 8, 0, false, "1400000011000000000000000000000001000000"),
    (130, 10, 0, true, "0010000000000000000000000400000003000000"),
    (131, 10, 0, true, "0410000000000000000000000400000003000000"),
    (132, 8, 0, false, "1400000011000000000000000000000001000000"),
    (133, 10, 0, true, "0010000000000000000000000400000004000000"),
    (134, 10, 0, true, "0410000000000000000000000400000004000000"),
    (135, 8, 0, false, "1400000011000000000000000000000001000000"),
    (136, 2, 0, false, "200000000100000000000000000000000000b4fe000000000000040000000000"),
    (137, 3, 0, false, "18000000000000000000b4fe000000000000040000000000"),
    (138, 3, 0, false, "180000000000000000000c00000000000000f43f00000000"),
    (139, 2, 1, false, "200000000100000000000c000000000000000c000000000000b0000000000000"),
    (140, 2, 1, false, "200000000300000000b00c000000000000b00c00000000000030000000000000"),
];

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn send(
    s: &UnixStream,
    id: u16,
    command: u16,
    posted: bool,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
) {
    let flags = if posted { NO_REPLY } else { 0 };
    let mut bytes = Vec::with_capacity(HEADER_SIZE + payload.len());
    bytes.extend_from_slice(&id.to_le_bytes());
    bytes.extend_from_slice(&command.to_le_bytes());
    bytes.extend_from_slice(&((HEADER_SIZE + payload.len()) as u32).to_le_bytes());
    bytes.extend_from_slice(&flags.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(payload);
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(16))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    let n = rustix::net::sendmsg(
        s,
        &[std::io::IoSlice::new(&bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .unwrap();
    assert_eq!(n, bytes.len());
}

/// Reads one reply: (msg_id, command, errno or 0, payload).
fn recv(s: &mut UnixStream) -> (u16, u16, u32, Vec<u8>) {
    let mut h = [0u8; HEADER_SIZE];
    s.read_exact(&mut h).unwrap();
    let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
    let id = u16::from_le_bytes([h[0], h[1]]);
    let command = u16::from_le_bytes([h[2], h[3]]);
    let (size, flags, error) = (u32_at(4) as usize, u32_at(8), u32_at(12));
    let mut payload = vec![0u8; size - HEADER_SIZE];
    s.read_exact(&mut payload).unwrap();
    assert_eq!(
        flags & 0xf,
        TYPE_REPLY,
        "message {id} (command {command}): the server sent a request, not a reply"
    );
    (
        id,
        command,
        if flags & ERROR != 0 { error } else { 0 },
        payload,
    )
}

fn u32_at(p: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(p[o..o + 4].try_into().unwrap())
}

/// A REGION_WRITE to a submission queue tail doorbell of BAR0 (region 0,
/// offset 0x1000 + 8 × qid; the payload is offset u64, region u32, count u32).
fn is_sq_doorbell(command: u16, payload: &[u8]) -> bool {
    command == REGION_WRITE
        && payload.len() >= 16
        && u32_at(payload, 8) == 0
        && u64_at(payload, 0) >= 0x1000
        && u64_at(payload, 0) < 0x2000
        && (u64_at(payload, 0) - 0x1000).is_multiple_of(8)
}

fn u64_at(p: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(p[o..o + 8].try_into().unwrap())
}

#[test]
fn qemu_realize_and_seabios_probe_replay_without_errors() {
    let spec: NamespaceSpec = "16M:ram".parse().unwrap();
    let device = DeviceOptions::default()
        .build(&[spec], &vnvme::identity::Origin::embedded())
        .unwrap();
    let controller = std::sync::Arc::clone(device.controller());
    let (mut client, server_end) = UnixStream::pair().unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let server = std::thread::spawn(move || {
        let mut server = vnvme_vfio_user::Server::new(device);
        server.serve_stream(server_end)
    });

    // Guest RAM: QEMU maps pieces of one memfd (offset = offset in the memfd).
    let ram: OwnedFd =
        rustix::fs::memfd_create("guest-ram", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&ram, 1 << 30).unwrap();
    let eventfds: Vec<OwnedFd> = (0..4)
        .map(|_| rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap())
        .collect();

    let mut version = vec![0u8; 4];
    version.extend_from_slice(
        br#"{"capabilities": {"pgsizes": 4096, "max_msg_fds": 16, "max_dma_maps": 65535, "max_data_xfer_size": 1048576, "migration": {"pgsize": 4096, "max_bitmap_size": 1048576}, "write_multiple": true}}"#,
    );
    version.push(0);
    send(&client, 0, 1, false, &version, &[]);
    let (_, _, err, _) = recv(&mut client);
    assert_eq!(err, 0, "VERSION");

    // Replies are read before each message that is not a DMA map/unmap, so
    // map transactions stay pipelined as QEMU's memory listener sends them.
    let mut pending: Vec<(u16, u16, Vec<u8>)> = Vec::new();
    let mut replies = Vec::new();
    for &(id, command, nfds, posted, hex) in QEMU_SEQUENCE {
        if !matches!(command, DMA_MAP | DMA_UNMAP) {
            for (pid, pcmd, req) in pending.drain(..) {
                let (rid, rcmd, err, payload) = recv(&mut client);
                assert_eq!((rid, rcmd), (pid, pcmd), "replies come in order");
                assert_eq!(
                    err, 0,
                    "message {pid} (command {pcmd}, payload {req:02x?}) failed with errno {err}"
                );
                replies.push((pid, pcmd, req, payload));
            }
        }
        let payload = unhex(hex);
        let fds: Vec<BorrowedFd<'_>> = match (command, nfds) {
            (_, 0) => Vec::new(),
            (DMA_MAP, 1) => vec![ram.as_fd()],
            (_, n) => eventfds.iter().take(n).map(|f| f.as_fd()).collect(),
        };
        let commands_before = controller.stats().commands;
        send(&client, id, command, posted, &payload, &fds);
        if is_sq_doorbell(command, &payload) {
            // SeaBIOS polls for the completion before it goes on (and QEMU's
            // memory listener remaps RAM meanwhile); the replay has no such
            // pause, so wait until the controller has run the commands, or
            // it may fetch them from memory the replay has since unmapped.
            let deadline = Instant::now() + Duration::from_millis(500);
            while controller.stats().commands == commands_before && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if !posted {
            pending.push((id, command, payload));
        }
    }
    for (pid, pcmd, req) in pending.drain(..) {
        let (rid, rcmd, err, payload) = recv(&mut client);
        assert_eq!((rid, rcmd), (pid, pcmd));
        assert_eq!(
            err, 0,
            "message {pid} (command {pcmd}, payload {req:02x?}) failed with errno {err}"
        );
        replies.push((pid, pcmd, req, payload));
    }

    // What QEMU relies on: PCI device with reset, 9 regions and 5 IRQ
    // indexes (fewer IRQs make realize fail); config region 7 with a size
    // (0 crashed QEMU); BAR0 holding registers, doorbells, MSI-X table, PBA.
    let reply = |cmd: u16, index: Option<u32>| {
        replies
            .iter()
            .find(|(_, c, req, _)| *c == cmd && index.is_none_or(|i| u32_at(req, 8) == i))
            .map(|(_, _, _, p)| p.clone())
            .unwrap()
    };
    let info = reply(4, None);
    assert_eq!(u32_at(&info, 4) & 0b11, 0b11, "PCI | RESET flags");
    assert!(u32_at(&info, 8) >= 9, "regions");
    assert_eq!(u32_at(&info, 12), 5, "IRQ indexes");
    assert_eq!(u64_at(&reply(5, Some(7)), 16), 4096, "config region size");
    assert_eq!(u64_at(&reply(5, Some(0)), 16), 0x4000, "BAR0 size");
    assert!(u32_at(&reply(7, Some(2)), 12) >= 1, "MSI-X vectors");

    // SeaBIOS enabled the controller with posted writes; it must be ready
    // and not fatal.
    send(
        &client,
        0xfff0,
        9,
        false,
        &unhex("1c000000000000000000000004000000"),
        &[],
    );
    let (_, _, err, csts) = recv(&mut client);
    assert_eq!(err, 0);
    let csts = u32_at(&csts, 16);
    assert_eq!(
        csts & 0b11,
        0b01,
        "CSTS.RDY set, CSTS.CFS clear (CSTS {csts:#x})"
    );

    drop(client);
    server.join().unwrap().unwrap();
}
