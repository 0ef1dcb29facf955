//! A finished kernel's console logs for Backend.AI's manager, as 26.x's agent hands them over
//! (`AbstractAgent.collect_logs`): the bytes cut into chunks of [`CHUNK`] (its `container-logs
//! chunk-size`, 64 KiB), each zlib-compressed, base64-encoded and wrapped as upstream's
//! `ContainerLogData` JSON (`{"compress_type": "zlib", "content": …}`), `RPUSH`ed to the list
//! `containerlog.<container id>` of logical database 6 (`REDIS_CONTAINER_LOG`), which expires
//! an hour later; then `do_sync_kernel_logs` tells the manager to fetch them.
//!
//! The bus sender pushes them right before it publishes that event, from the log the agent
//! keeps of the kernel (`LogStore`, at most twice `[container] log-tail`, kept for
//! `log-retention`): durable like the event, and never twice (the push claims the event's id
//! first, as the publish does).

use std::io::Write;

use base64::Engine;

/// Bytes per chunk (upstream's default `container-logs.chunk-size`).
pub const CHUNK: usize = 64 << 10;

/// Logical database of the log lists (`ai.backend.common.defs.REDIS_CONTAINER_LOG`).
pub const CONTAINER_LOG_DB: i64 = 6;

/// Seconds a log list lives (upstream's `enqueue_container_logs`: one hour).
pub const LIST_TTL_SECS: u64 = 3600;

/// Most log bytes handed over (upstream's `container-logs.max-length` default is 10 MiB; the
/// agent keeps at most twice `log-tail` anyway).
pub const MAX_BYTES: usize = 10 << 20;

/// The list key of `container_id`'s logs.
pub fn list_key(container_id: &str) -> String {
    format!("containerlog.{container_id}")
}

/// `KEYS[1]` the push's dedup key, `KEYS[2]` the list; `ARGV[1]` the dedup TTL, `ARGV[2]` the
/// list's TTL, `ARGV[3..]` the chunks. Returns 1 when pushed now, 0 when pushed before.
pub const PUSH_SCRIPT: &str = r"
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  return 0
end
if #ARGV > 2 then
  redis.call('RPUSH', KEYS[2], unpack(ARGV, 3))
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end
return 1
";

/// The dedup key of the log push of event `id`.
pub fn dedup_key(id: &str) -> String {
    format!("kernelvisor:bus:logs:{id}")
}

/// `logs` as upstream's serialized `ContainerLogData` chunks, in order.
pub fn chunks(logs: &[u8]) -> Vec<String> {
    logs.chunks(CHUNK)
        .map(|chunk| {
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            z.write_all(chunk).expect("writing to a Vec");
            let compressed = z.finish().expect("writing to a Vec");
            serde_json::json!({
                "compress_type": "zlib",
                "content": base64::engine::general_purpose::STANDARD.encode(compressed),
            })
            .to_string()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn chunks_are_upstreams_container_log_data() {
        let logs: Vec<u8> = (0..(CHUNK * 2 + 10)).map(|i| (i % 251) as u8).collect();
        let chunks = chunks(&logs);
        assert_eq!(chunks.len(), 3);
        let mut back = Vec::new();
        for c in &chunks {
            let v: serde_json::Value = serde_json::from_str(c).unwrap();
            assert_eq!(v["compress_type"], "zlib");
            let raw = base64::engine::general_purpose::STANDARD
                .decode(v["content"].as_str().unwrap())
                .unwrap();
            flate2::read::ZlibDecoder::new(&raw[..])
                .read_to_end(&mut back)
                .unwrap();
        }
        assert_eq!(back, logs);
        assert!(super::chunks(b"").is_empty(), "no logs: nothing pushed");
        assert_eq!(list_key("abc"), "containerlog.abc");
    }
}
