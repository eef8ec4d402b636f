//! Endpoint rules of vLLM's `KVEventsConfig`: which endpoints are bound and
//! which connected, and the port offset of a data-parallel rank.

use crate::{Error, Result};

/// Whether the PUB socket binds `endpoint` (a wildcard host, `::`, `ipc://`
/// or `inproc://`) rather than connecting to it. The replay socket always binds.
pub fn is_bind_endpoint(endpoint: &str) -> bool {
    endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://")
}

/// `endpoint` for data-parallel rank `rank`: rank 0 keeps it; other ranks
/// add the rank to a TCP port (a port of 0 stays 0, for the OS to choose) or
/// append `_dp{rank}` to an `inproc://` name; `ipc://` paths are kept.
pub fn offset_for_rank(endpoint: &str, rank: u32) -> Result<String> {
    if rank == 0 || endpoint.starts_with("ipc://") {
        return Ok(endpoint.to_owned());
    }
    if endpoint.contains("inproc") {
        return Ok(format!("{endpoint}_dp{rank}"));
    }
    if !endpoint.starts_with("tcp://") {
        return Err(Error::InvalidConfig(format!(
            "endpoint {endpoint:?}: expected tcp://, ipc:// or inproc://"
        )));
    }
    let (base, port) = endpoint
        .rsplit_once(':')
        .filter(|(b, _)| b.len() > "tcp:/".len())
        .ok_or_else(|| Error::InvalidConfig(format!("endpoint {endpoint:?} has no port")))?;
    let port: u32 = port
        .parse()
        .map_err(|_| Error::InvalidConfig(format!("endpoint {endpoint:?}: bad port")))?;
    if port == 0 {
        return Ok(endpoint.to_owned());
    }
    let port = port + rank;
    if port > u32::from(u16::MAX) {
        return Err(Error::InvalidConfig(format!(
            "endpoint {endpoint:?} offset by rank {rank} passes port 65535"
        )));
    }
    Ok(format!("{base}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_or_connect() {
        assert!(is_bind_endpoint("tcp://*:5557"));
        assert!(is_bind_endpoint("tcp://[::]:5557"));
        assert!(is_bind_endpoint("ipc:///tmp/kv"));
        assert!(is_bind_endpoint("inproc://kv"));
        assert!(!is_bind_endpoint("tcp://10.0.0.2:5557"));
        assert!(!is_bind_endpoint("tcp://router:5557"));
    }

    #[test]
    fn rank_offsets() {
        assert_eq!(offset_for_rank("tcp://*:5557", 0).unwrap(), "tcp://*:5557");
        assert_eq!(offset_for_rank("tcp://*:5557", 3).unwrap(), "tcp://*:5560");
        assert_eq!(offset_for_rank("tcp://*:0", 3).unwrap(), "tcp://*:0");
        assert_eq!(
            offset_for_rank("inproc://kv", 2).unwrap(),
            "inproc://kv_dp2"
        );
        assert_eq!(
            offset_for_rank("ipc:///tmp/kv", 2).unwrap(),
            "ipc:///tmp/kv"
        );
        assert!(offset_for_rank("tcp://*:65535", 1).is_err());
        assert!(offset_for_rank("tcp://*:port", 1).is_err());
        assert!(offset_for_rank("udp://*:1", 1).is_err());
    }
}
