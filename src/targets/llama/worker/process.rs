//! The worker process as the parent holds it ([`Worker`]): its pipes, the thread that reads and
//! decodes its reply frames (bounded, a group at a time, steps shared through a
//! [`StepCache`]), the end of its stderr, and how it ended ([`Death`]): the fork server's child
//! or the whole server, with what it printed. What the replies mean, the batches and the
//! crashing prefixes, is `parent.rs`'s.

use std::collections::VecDeque;
use std::io::{BufReader, Read};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::wire::{
    parse_reply_frame_shared, read_frame_limited, whole_frame_buffered, FrameRead, Reply,
    StepCache, WireError, DIED_MARKER, MAX_REPLY_FRAME_BYTES,
};
use crate::targets::llama::sys;

/// One reply as the reader thread decoded it.
pub(super) type ReplyLine = Result<Reply, WireError>;

/// How much of the worker's stderr is kept (its end: llama.cpp's last words). A sanitizer's
/// report, with its stacks and shadow bytes, runs to a few KiB and must be kept from its start.
const STDERR_KEEP: usize = 64 * 1024;

/// A started worker process as the parent holds it.
pub(super) struct Worker {
    pub(super) child: Child,
    pub(super) stdin: ChildStdin,
    /// Groups of decoded stdout lines, as the reader thread found them in one read; `None` at
    /// the end.
    lines: Receiver<Option<Vec<ReplyLine>>>,
    /// Lines of the last group not taken yet.
    pending: VecDeque<ReplyLine>,
    stderr: Arc<Mutex<String>>,
    /// Ends when the child's stderr closes: join it before reading what a dead child said.
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

/// How a trial's process died, and what it printed.
pub(super) struct Death {
    pub(super) status: Option<std::process::ExitStatus>,
    pub(super) stderr: String,
    /// Whether the fork server lives on (only its child died) and can take the next request.
    pub(super) server_alive: bool,
}

impl Worker {
    /// Starts `cmd` (the worker's command line) with its three pipes, a thread that reads and
    /// decodes its reply frames and hands them on a group at a time, and one that keeps the end
    /// of its stderr (llama.cpp's last words).
    pub(super) fn spawn(cmd: &mut Command) -> std::io::Result<Worker> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut stderr_pipe = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            // The worker writes its replies in groups: pass each group on in one message (a
            // message per frame cost the parent a wake-up per trial). Frames are decoded here,
            // on this thread, into one reused buffer, each at most MAX_REPLY_FRAME_BYTES long.
            let mut reader = BufReader::with_capacity(1 << 16, stdout);
            let mut frame = Vec::new();
            // The steps this worker sent, by their bytes: a step sent again is handed on as
            // the observation decoded the first time (see `wire`'s `StepCache`).
            let mut steps = StepCache::default();
            loop {
                // A group's replies without growing the vector (each growth was a fresh
                // allocation of the reader's, for every group).
                let mut group = Vec::with_capacity(64);
                loop {
                    match read_frame_limited(&mut reader, &mut frame, MAX_REPLY_FRAME_BYTES) {
                        Ok(FrameRead::Frame) => {
                            group.push(parse_reply_frame_shared(&frame, &mut steps))
                        }
                        Ok(FrameRead::TooLong) => group.push(Err(WireError::TooLong {
                            what: "reply",
                            limit: MAX_REPLY_FRAME_BYTES,
                        })),
                        Ok(FrameRead::Truncated) => {
                            // The pipe ended inside a frame: the worker died writing it (as a
                            // half line ended the JSON wire), which the parent learns next.
                            group.push(Err(WireError::Malformed {
                                what: "reply",
                                error: "the pipe ended inside a frame".into(),
                                excerpt: String::new(),
                            }));
                            let _ = tx.send(Some(group));
                            let _ = tx.send(None);
                            return;
                        }
                        Ok(FrameRead::End) | Err(_) => {
                            if !group.is_empty() {
                                let _ = tx.send(Some(group));
                            }
                            let _ = tx.send(None);
                            return;
                        }
                    }
                    // Another read only if a whole frame is already buffered (no system call).
                    if !whole_frame_buffered(reader.buffer()) {
                        break;
                    }
                }
                if tx.send(Some(group)).is_err() {
                    return;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let keep = stderr.clone();
        let stderr_reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut s = keep.lock().expect("stderr buffer");
                s.push_str(&String::from_utf8_lossy(&buf[..n]));
                if s.len() > STDERR_KEEP {
                    let cut = s.len() - STDERR_KEEP / 2;
                    let cut = (cut..s.len())
                        .find(|&i| s.is_char_boundary(i))
                        .unwrap_or(s.len());
                    s.drain(..cut);
                }
            }
        });
        Ok(Worker {
            child,
            stdin,
            lines,
            pending: VecDeque::new(),
            stderr,
            stderr_reader: Some(stderr_reader),
        })
    }

    /// Waits for the child to end and for its stderr to be drained; returns status and text.
    pub(super) fn reap(&mut self) -> (Option<std::process::ExitStatus>, String) {
        let status = self.child.wait().ok();
        if let Some(h) = self.stderr_reader.take() {
            let _ = h.join();
        }
        let text = self.stderr.lock().expect("stderr buffer").clone();
        (status, text)
    }

    /// The next line the worker wrote, decoded: `Ok(None)` when its stdout has closed.
    pub(super) fn next_line(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<ReplyLine>, RecvTimeoutError> {
        if let Some(l) = self.pending.pop_front() {
            return Ok(Some(l));
        }
        match self.lines.recv_timeout(timeout)? {
            Some(group) => {
                self.pending.extend(group);
                Ok(self.pending.pop_front())
            }
            None => Ok(None),
        }
    }

    /// The whole worker process ended (its stdout closed).
    pub(super) fn server_died(&mut self) -> Death {
        let (status, stderr) = self.reap();
        Death {
            status,
            stderr,
            server_alive: false,
        }
    }

    /// The fork server said its child died with the raw wait status `raw`. Takes what the child
    /// printed: everything on stderr up to the server's [`DIED_MARKER`] line, which it writes
    /// after the child has ended (waiting briefly for the reader thread to catch up).
    pub(super) fn child_died(&mut self, raw: i32) -> Death {
        use std::os::unix::process::ExitStatusExt;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let stderr = loop {
            {
                let mut buf = self.stderr.lock().expect("stderr buffer");
                if let Some(i) = buf.find(DIED_MARKER) {
                    let text = buf[..i].to_string();
                    let end = buf[i..].find('\n').map_or(buf.len(), |n| i + n + 1);
                    buf.drain(..end);
                    break text;
                }
                if std::time::Instant::now() > deadline {
                    break std::mem::take(&mut *buf);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        Death {
            status: Some(std::process::ExitStatus::from_raw(raw)),
            stderr,
            server_alive: true,
        }
    }

    /// Ends a hanging trial: SIGABRT to the worker, which its fork server forwards to the running
    /// child; then the child's death as the server reports it, or the server's own end.
    pub(super) fn abort_hang(&mut self) -> Death {
        // Our own child, waited for (reaped) before it is dropped, so the pid is still its. A
        // failure means it is gone already, which the reads below find out.
        let _ = sys::send_sigabrt(self.child.id());
        loop {
            match self.next_line(Duration::from_secs(10)) {
                Ok(Some(l)) => {
                    if let Ok(Reply::Died(raw)) = l {
                        return self.child_died(raw);
                    }
                    // A reply the child flushed before it was stopped: the trial it answers ran
                    // before the hang and is sent again with the rest.
                }
                Ok(None) | Err(RecvTimeoutError::Disconnected) => return self.server_died(),
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    return self.server_died();
                }
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
