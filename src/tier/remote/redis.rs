//! Valkey/Redis backends: a single server or a Cluster, plain or TLS
//! (`rediss://`), with ACL credentials from the URL
//! (`redis://user:password@host:port/`).
//!
//! Batches are pipelined (`GET`, `EXISTS`, `SET key value NX`); in Cluster
//! mode the pipeline is split by slot owner. Every socket operation has a
//! timeout; after a failure the connection is dropped and no reconnection
//! is tried for `retry_after`, so a dead server costs one refused connect
//! per interval, not one per lookup. Operators should run the servers with
//! `maxmemory` and `maxmemory-policy allkeys-lru`: blocks are a cache, and
//! any of them may go.

use std::time::{Duration, Instant};

use redis::cluster::{cluster_pipe, ClusterClient, ClusterConnection};
use redis::{Client, Connection, ConnectionLike, Pipeline, RedisResult, Value};

use super::{RemoteBackend, RemoteError, ROUND_TRIP_BYTES};
use crate::error::{Error, Result};

/// Timeouts of a [`RedisRemote`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisOptions {
    /// Connecting (per node).
    pub connect_timeout: Duration,
    /// Reading or writing one pipeline's bytes.
    pub io_timeout: Duration,
    /// Wait after a failure before connecting again.
    pub retry_after: Duration,
}

impl Default for RedisOptions {
    /// 200 ms to connect, 1 s per operation, 500 ms between reconnections.
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_millis(200),
            io_timeout: Duration::from_secs(1),
            retry_after: Duration::from_millis(500),
        }
    }
}

enum Target {
    Single(Client),
    Cluster(ClusterClient),
}

enum Conn {
    Single(Connection),
    Cluster(ClusterConnection),
}

/// A [`RemoteBackend`] on a Valkey/Redis server or Cluster.
pub struct RedisRemote {
    target: Target,
    options: RedisOptions,
    conn: Option<Conn>,
    retry_at: Option<Instant>,
}

impl std::fmt::Debug for RedisRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.target {
            Target::Single(_) => "single",
            Target::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisRemote")
            .field("mode", &mode)
            .field("options", &self.options)
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

fn invalid(e: redis::RedisError) -> Error {
    Error::InvalidConfig(format!("remote URL: {e}"))
}

impl RedisRemote {
    /// A backend on one server, `redis://[user:password@]host:port[/db]` or
    /// `rediss://...` for TLS. Connects lazily: an unreachable server is a
    /// miss, not an error.
    pub fn single(url: &str, options: RedisOptions) -> Result<Self> {
        let client = Client::open(url).map_err(invalid)?;
        Ok(Self::with_target(Target::Single(client), options))
    }

    /// A backend on a Cluster, given one or more of its nodes' URLs (the
    /// rest are discovered). Credentials and TLS come from the first URL.
    pub fn cluster(urls: &[&str], options: RedisOptions) -> Result<Self> {
        if urls.is_empty() {
            return Err(Error::InvalidConfig(
                "a cluster needs at least one node URL".into(),
            ));
        }
        let client = ClusterClient::builder(urls.to_vec())
            .connection_timeout(options.connect_timeout)
            .retries(1)
            .min_retry_wait(10)
            .max_retry_wait(50)
            .build()
            .map_err(invalid)?;
        Ok(Self::with_target(Target::Cluster(client), options))
    }

    /// A backend from a spec: a URL for one server, or `cluster:` followed
    /// by comma-separated node URLs.
    pub fn from_spec(spec: &str, options: RedisOptions) -> Result<Self> {
        match spec.strip_prefix("cluster:") {
            Some(list) => Self::cluster(&list.split(',').collect::<Vec<_>>(), options),
            None => Self::single(spec, options),
        }
    }

    fn with_target(target: Target, options: RedisOptions) -> Self {
        Self {
            target,
            options,
            conn: None,
            retry_at: None,
        }
    }

    /// The open connection, connecting when none is and the retry interval has passed.
    fn connection(&mut self) -> Result<&mut Conn, RemoteError> {
        if self.conn.is_none() {
            if self.retry_at.is_some_and(|t| Instant::now() < t) {
                return Err(RemoteError("waiting before reconnecting".into()));
            }
            let io = Some(self.options.io_timeout);
            let opened: RedisResult<Conn> = match &self.target {
                Target::Single(client) => client
                    .get_connection_with_timeout(self.options.connect_timeout)
                    .and_then(|c| {
                        c.set_read_timeout(io)?;
                        c.set_write_timeout(io)?;
                        Ok(Conn::Single(c))
                    }),
                Target::Cluster(client) => client.get_connection().and_then(|c| {
                    c.set_read_timeout(io)?;
                    c.set_write_timeout(io)?;
                    Ok(Conn::Cluster(c))
                }),
            };
            match opened {
                Ok(c) => self.conn = Some(c),
                Err(e) => return Err(self.failed(e)),
            }
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// Drops the connection after an error and schedules the next attempt.
    fn failed(&mut self, e: redis::RedisError) -> RemoteError {
        self.conn = None;
        self.retry_at = Some(Instant::now() + self.options.retry_after);
        RemoteError(e.to_string())
    }

    /// Runs one command per key, pipelined, and returns the replies.
    fn pipelined<T: redis::FromRedisValue>(
        &mut self,
        commands: impl Fn(&mut dyn PipelineLike),
    ) -> Result<Vec<T>, RemoteError> {
        let result = match self.connection()? {
            Conn::Single(c) => {
                let mut p = redis::pipe();
                commands(&mut p);
                p.query::<Vec<T>>(c)
            }
            Conn::Cluster(c) => {
                let mut p = cluster_pipe();
                commands(&mut p);
                p.query::<Vec<T>>(c)
            }
        };
        result.map_err(|e| self.failed(e))
    }

    /// Whether the connection (if any) is open; for diagnostics.
    pub fn is_connected(&self) -> bool {
        match &self.conn {
            Some(Conn::Single(c)) => c.is_open(),
            Some(Conn::Cluster(c)) => c.is_open(),
            None => false,
        }
    }
}

/// `entries` in runs of at most `limit` value bytes (at least one entry each).
fn by_bytes(
    entries: &[(Vec<u8>, Vec<u8>)],
    limit: usize,
) -> impl Iterator<Item = &[(Vec<u8>, Vec<u8>)]> {
    let mut rest = entries;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let n = rest
            .iter()
            .position(|(_, v)| {
                bytes += v.len();
                bytes > limit
            })
            .unwrap_or(rest.len())
            .max(1);
        let (run, tail) = rest.split_at(n);
        rest = tail;
        Some(run)
    })
}

/// The commands both pipeline kinds take.
trait PipelineLike {
    fn add(&mut self, name: &str, args: &[&[u8]]);
}

impl PipelineLike for Pipeline {
    fn add(&mut self, name: &str, args: &[&[u8]]) {
        let cmd = self.cmd(name);
        for a in args {
            cmd.arg(*a);
        }
    }
}

impl PipelineLike for redis::cluster::ClusterPipeline {
    fn add(&mut self, name: &str, args: &[&[u8]]) {
        let cmd = self.cmd(name);
        for a in args {
            cmd.arg(*a);
        }
    }
}

impl RemoteBackend for RedisRemote {
    fn get(&mut self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
        self.pipelined(|p| {
            for k in keys {
                p.add("GET", &[k]);
            }
        })
    }

    fn exists(&mut self, keys: &[Vec<u8>]) -> Result<Vec<bool>, RemoteError> {
        self.pipelined(|p| {
            for k in keys {
                p.add("EXISTS", &[k]);
            }
        })
    }

    fn put_if_absent(&mut self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<(), RemoteError> {
        for batch in by_bytes(entries, ROUND_TRIP_BYTES) {
            // `SET NX` answers OK or nil: both are fine.
            self.pipelined::<Value>(|p| {
                for (k, v) in batch {
                    p.add("SET", &[k, v, b"NX"]);
                }
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_split_into_runs_of_bounded_bytes_each_with_at_least_one_value() {
        let entry = |n: usize| (vec![0u8], vec![0u8; n]);
        let entries: Vec<_> = [3, 3, 5, 1, 1, 1, 9].into_iter().map(entry).collect();
        let runs: Vec<Vec<usize>> = by_bytes(&entries, 6)
            .map(|run| run.iter().map(|(_, v)| v.len()).collect())
            .collect();
        assert_eq!(runs, [vec![3, 3], vec![5, 1], vec![1, 1], vec![9]]);
        assert_eq!(by_bytes(&[], 6).count(), 0);
    }
}
