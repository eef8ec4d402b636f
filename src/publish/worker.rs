//! The publishing thread: batches queued events, sends them on the PUB
//! socket and answers replay requests on the ROUTER socket.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::endpoint::{is_bind_endpoint, offset_for_rank};
use super::wire::{encode_batch, WireEvent};
use super::{Command, PublisherConfig, Shared};
use crate::{Error, Result};

/// Sequence number of the replay stream's end marker (-1, as vLLM).
const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// How long the idle thread waits for events before it looks for replay
/// requests again.
const IDLE_POLL: Duration = Duration::from_millis(10);

/// One ZeroMQ context for the process, like pyzmq's `Context.instance()`,
/// so `inproc://` endpoints reach every publisher's sockets.
fn context() -> &'static zmq::Context {
    static CONTEXT: OnceLock<zmq::Context> = OnceLock::new();
    CONTEXT.get_or_init(zmq::Context::new)
}

fn zmq_error(what: &str, endpoint: &str, e: zmq::Error) -> Error {
    Error::InvalidConfig(format!("publisher: {what} {endpoint:?}: {e}"))
}

/// The sockets, opened on the caller's thread (so errors reach it) and then
/// moved to the publishing thread, which alone uses them.
pub(crate) struct Sockets {
    publisher: zmq::Socket,
    replay: Option<zmq::Socket>,
    pub(crate) endpoint: String,
    pub(crate) replay_endpoint: Option<String>,
}

impl Sockets {
    pub(crate) fn open(config: &PublisherConfig) -> Result<Self> {
        let rank = config.data_parallel_rank;
        let endpoint = offset_for_rank(&config.endpoint, rank)?;
        let publisher = context()
            .socket(zmq::PUB)
            .map_err(|e| zmq_error("socket for", &endpoint, e))?;
        publisher
            .set_sndhwm(config.hwm)
            .map_err(|e| zmq_error("hwm for", &endpoint, e))?;
        publisher
            .set_linger(0)
            .map_err(|e| zmq_error("linger for", &endpoint, e))?;
        let endpoint = if is_bind_endpoint(&endpoint) {
            bind(&publisher, &endpoint)?
        } else {
            publisher
                .connect(&endpoint)
                .map_err(|e| zmq_error("connect to", &endpoint, e))?;
            endpoint
        };
        let (replay, replay_endpoint) = match &config.replay_endpoint {
            None => (None, None),
            Some(r) => {
                let r = offset_for_rank(r, rank)?;
                let router = context()
                    .socket(zmq::ROUTER)
                    .map_err(|e| zmq_error("socket for", &r, e))?;
                // Room for a whole replay and its end marker (vLLM's choice).
                let hwm = i32::try_from(2 * (config.buffer_steps + 1)).unwrap_or(i32::MAX);
                router
                    .set_sndhwm(hwm)
                    .map_err(|e| zmq_error("hwm for", &r, e))?;
                router
                    .set_linger(0)
                    .map_err(|e| zmq_error("linger for", &r, e))?;
                let r = bind(&router, &r)?;
                (Some(router), Some(r))
            }
        };
        Ok(Self {
            publisher,
            replay,
            endpoint,
            replay_endpoint,
        })
    }
}

/// Binds `endpoint`; returns the endpoint bound (the OS's port for port 0).
fn bind(socket: &zmq::Socket, endpoint: &str) -> Result<String> {
    socket
        .bind(endpoint)
        .map_err(|e| zmq_error("bind", endpoint, e))?;
    match socket.get_last_endpoint() {
        Ok(Ok(bound)) if endpoint.starts_with("tcp://") => Ok(bound),
        _ => Ok(endpoint.to_owned()),
    }
}

/// Starts the publishing thread.
pub(crate) fn spawn(
    sockets: Sockets,
    config: PublisherConfig,
    commands: Receiver<Command>,
    shared: Arc<Shared>,
) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("mla-kv-events".into())
        .spawn(move || Worker::new(sockets, config, shared).run(commands))
        .map_err(|e| Error::InvalidConfig(format!("publisher: cannot start its thread: {e}")))
}

struct Worker {
    sockets: Sockets,
    config: PublisherConfig,
    shared: Arc<Shared>,
    topic: Vec<u8>,
    /// The open batch and when its first event arrived.
    batch: Vec<WireEvent>,
    opened: Option<Instant>,
    next_seq: u64,
    /// The last `buffer_steps` batches sent, for replay.
    sent: VecDeque<(u64, Vec<u8>)>,
}

impl Worker {
    fn new(sockets: Sockets, config: PublisherConfig, shared: Arc<Shared>) -> Self {
        Self {
            topic: config.topic.as_bytes().to_vec(),
            sockets,
            config,
            shared,
            batch: Vec::new(),
            opened: None,
            next_seq: 0,
            sent: VecDeque::new(),
        }
    }

    fn run(mut self, commands: Receiver<Command>) {
        loop {
            let wait = match self.opened {
                Some(t) => self.config.max_batch_delay.saturating_sub(t.elapsed()),
                None => IDLE_POLL,
            };
            match commands.recv_timeout(wait) {
                Ok(Command::Events(events)) => self.take(events),
                Ok(Command::Flush(done)) => {
                    self.send_batch();
                    // The caller may have stopped waiting.
                    let _ = done.send(());
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.send_batch();
                    self.serve_replays();
                    return;
                }
            }
            if self
                .opened
                .is_some_and(|t| t.elapsed() >= self.config.max_batch_delay)
            {
                self.send_batch();
            }
            self.serve_replays();
        }
    }

    /// Moves queued events into the open batch, sending every full one.
    fn take(&mut self, events: Vec<WireEvent>) {
        self.shared.queued.fetch_sub(events.len(), Ordering::AcqRel);
        if self.batch.is_empty() {
            self.opened = Some(Instant::now());
        }
        for e in events {
            self.batch.push(e);
            if self.batch.len() >= self.config.max_batch_events {
                self.send_batch();
                self.opened = Some(Instant::now());
            }
        }
        if self.batch.is_empty() {
            self.opened = None;
        }
    }

    /// Sends the open batch, if it holds any event, with the next sequence number.
    fn send_batch(&mut self) {
        self.opened = None;
        if self.batch.is_empty() {
            return;
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let payload = encode_batch(ts, &self.batch, self.config.data_parallel_rank);
        let seq = self.next_seq;
        self.next_seq += 1;
        let frames: [&[u8]; 3] = [&self.topic, &seq.to_be_bytes(), &payload];
        // A PUB socket never blocks: past its high-water mark, or with no
        // subscriber, ZeroMQ drops the message (subscribers see the gap in
        // the sequence numbers and can ask the replay socket).
        if self
            .sockets
            .publisher
            .send_multipart(frames, zmq::DONTWAIT)
            .is_ok()
        {
            self.shared
                .published
                .fetch_add(self.batch.len() as u64, Ordering::Relaxed);
        }
        self.shared.batches.store(self.next_seq, Ordering::Relaxed);
        self.batch.clear();
        if self.config.buffer_steps > 0 {
            if self.sent.len() == self.config.buffer_steps {
                self.sent.pop_front();
            }
            self.sent.push_back((seq, payload));
        }
    }

    /// Answers every waiting replay request: `[identity, "", start_seq]` gets
    /// the buffered batches from `start_seq` on, then the end marker.
    fn serve_replays(&mut self) {
        let Some(router) = &self.sockets.replay else {
            return;
        };
        while let Ok(frames) = router.recv_multipart(zmq::DONTWAIT) {
            let [id, empty, start] = frames.as_slice() else {
                continue;
            };
            let Ok(start) = <[u8; 8]>::try_from(start.as_slice()) else {
                continue;
            };
            let start = u64::from_be_bytes(start);
            for (seq, payload) in self.sent.iter().filter(|(s, _)| *s >= start) {
                let frames: [&[u8]; 5] = [id, empty, &self.topic, &seq.to_be_bytes(), payload];
                // A client that went away or stopped reading loses its replay.
                let _ = router.send_multipart(frames, zmq::DONTWAIT);
            }
            // Counted before the end marker goes out, so a client that has
            // the marker finds its replay counted.
            self.shared.replays.fetch_add(1, Ordering::Relaxed);
            let end: [&[u8]; 5] = [id, empty, b"", &END_SEQ, b""];
            let _ = router.send_multipart(end, zmq::DONTWAIT);
        }
    }
}
