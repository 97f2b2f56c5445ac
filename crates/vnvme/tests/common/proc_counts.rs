//! A server process's threads and open fds, for the checks that a live
//! upgrade's new process has what the old one had (no leak).

use std::time::{Duration, Instant};

/// Threads and open fds (what each is, sockets and anonymous inodes by
/// kind) of process `pid`; without the files the clients' guest memory
/// lies in, whose number follows the clients' maps (our driver maps more
/// memory as its I/O needs it).
pub fn counts(pid: u32) -> (usize, Vec<String>) {
    let dir = |what: &str| std::fs::read_dir(format!("/proc/{pid}/{what}")).unwrap();
    let mut fds: Vec<String> = dir("fd")
        .map(|e| {
            let link = std::fs::read_link(e.unwrap().path()).unwrap_or_default();
            let link = link.display().to_string();
            link.split(":[").next().unwrap_or_default().to_string()
        })
        // An fd closed between the listing and its link has none.
        .filter(|l| !l.is_empty() && !l.starts_with("/memfd:vnvme-dma"))
        .collect();
    fds.sort();
    // The kernel's io_uring workers (`iou-wrk-TID`) come and go with
    // the file backend's blocking I/O: not the server's threads.
    let threads = dir("task")
        .filter(|e| {
            let comm = e.as_ref().map(|e| e.path().join("comm")).ok();
            !comm
                .and_then(|c| std::fs::read_to_string(c).ok())
                .is_some_and(|n| n.starts_with("iou-wrk"))
        })
        .count();
    (threads, fds)
}

/// [`counts`] once they are `want`, or as they are after 10 s: an fd the
/// server is closing (the control connection that asked for the upgrade)
/// lists for a moment, its link already gone (the clean-clone check of
/// a8cacfd saw one extra fd named ""), but a leaked one stays.
pub fn settled_counts(pid: u32, want: &(usize, Vec<String>)) -> (usize, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = counts(pid);
        if &now == want || Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
