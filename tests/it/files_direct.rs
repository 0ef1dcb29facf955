//! File transfers straight through the kernel's root (`/proc/<pid>/root`,
//! `src/agent/files/direct.rs`) on the real Docker engine, through the agent's real RPC
//! (kernelvisor's chunked `upload_file` / `download_single`):
//! - a chunked upload into a vfolder mounted under `/home/work` lands in the vfolder on the host
//!   (what the kernel sees there), not in the scratch directory beneath the mount, owned by the
//!   kernel's own `uid` / `main_gid`, and comes back the same in chunks with its size and mode;
//! - chunks naming their offsets are written in order whatever order they come in;
//! - while an upload is in flight its data is in a hidden file beside the old one, which it
//!   replaces once whole; an upload cut short (its `eof` before its declared size) is refused
//!   with `UploadSizeMismatch` and leaves the old file as it was, with nothing beside it;
//! - a symlink the kernel makes to `/etc` on the way is refused with `InvalidPath` both ways.
//!
//! Agent host ports: 37850–37853 (before the fixture's shift).

use crate::common;

use std::os::unix::fs::MetadataExt;

use rmpv::Value;

use common::agent::*;
use kernelvisor::agent::Agent;
use kernelvisor::rpc::Peer;

const MIB: u64 = 1 << 20;

/// kernelvisor's chunked upload of `chunks` (the first declares `size`; the last has `eof`):
/// the outcome of the last call made (the first that failed, if one did).
async fn upload_chunks(
    peer: &Peer,
    kid: &str,
    path: &str,
    chunks: &[Vec<u8>],
    size: u64,
) -> Result<Value, kernelvisor::rpc::CallError> {
    let id = format!("up-{}", run_id());
    let mut last = Ok(Value::Nil);
    for (i, chunk) in chunks.iter().enumerate() {
        let mut opts = vec![
            ("upload_id", Value::from(id.as_str())),
            ("eof", Value::from(i + 1 == chunks.len())),
        ];
        if i == 0 {
            opts.push(("size", size.into()));
        }
        last = call(
            peer,
            "upload_file",
            vec![
                kid.into(),
                path.into(),
                Value::Binary(chunk.clone()),
                map(opts),
            ],
        )
        .await;
        if last.is_err() {
            break;
        }
    }
    last
}

/// kernelvisor's chunked download of `path` in chunks of `chunk` bytes: the bytes, and the
/// first answer's size and mode.
async fn download_chunks(
    peer: &Peer,
    kid: &str,
    path: &str,
    chunk: u64,
) -> Result<(Vec<u8>, u64, u64), kernelvisor::rpc::CallError> {
    let mut opts = vec![("chunk_size", Value::from(chunk))];
    let (mut data, mut size, mut mode) = (Vec::new(), 0, 0);
    loop {
        let r = call(
            peer,
            "download_single",
            vec![kid.into(), path.into(), map(opts.clone())],
        )
        .await?;
        if let Value::Binary(b) = field(&r, "data") {
            assert!(b.len() as u64 <= chunk, "{} bytes in a chunk", b.len());
            data.extend_from_slice(b);
        }
        if data.len() as u64 <= chunk {
            size = field(&r, "size").as_u64().unwrap();
            mode = field(&r, "mode").as_u64().unwrap();
        }
        match field(&r, "download_id") {
            Value::String(id) => {
                opts = vec![
                    ("chunk_size", Value::from(chunk)),
                    ("download_id", Value::from(id.as_str().unwrap())),
                ];
            }
            _ => return Ok((data, size, mode)),
        }
    }
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

#[actix_rt::test]
async fn chunked_transfers_go_straight_through_the_kernels_root() {
    let fx = AgentFixture::new("files-direct", 37850, 4);
    let agent = Agent::start(fx.config(""), None)
        .await
        .expect("agent starts (is the Docker engine up?)");
    let peer = client(agent.endpoint()).await;
    let vf = fx.vfolder_root().join("data");
    std::fs::create_dir(&vf).unwrap();
    let kid = format!("k-{}", run_id());
    let config = kernel_config(
        "0.1",
        64 * MIB,
        vec![
            ("uid", 2345.into()),
            ("main_gid", 2346.into()),
            (
                "mounts",
                Value::Array(vec![map(vec![
                    ("name", "data".into()),
                    ("host_path", vf.display().to_string().into()),
                    ("permission", "rw".into()),
                ])]),
            ),
        ],
    );
    let info = create_one(&peer, "s-files-direct", &kid, config)
        .await
        .unwrap();
    let cid = field(&info, "container_id").as_str().unwrap().to_owned();
    let work = fx.scratch_root().join(&kid).join("work");

    // Into the vfolder mounted at /home/work/data, in 1 MiB chunks, a new directory on the way.
    let data = noise((3 * MIB + 12_345) as usize, 7);
    let chunks: Vec<Vec<u8>> = data.chunks(MIB as usize).map(<[u8]>::to_vec).collect();
    let r = upload_chunks(&peer, &kid, "data/sub/big.bin", &chunks, data.len() as u64)
        .await
        .unwrap();
    assert_eq!(field(&r, "received").as_u64(), Some(data.len() as u64));
    let on_host = vf.join("sub/big.bin");
    assert_eq!(std::fs::read(&on_host).unwrap(), data, "in the vfolder");
    assert!(
        !work.join("data/sub").exists(),
        "nothing under the mount point in the scratch directory"
    );
    for p in [vf.join("sub"), on_host.clone()] {
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (2345, 2346), "{}", p.display());
    }
    assert_eq!(
        docker(&["exec", &cid, "sh", "-c", "stat -c %s:%a data/sub/big.bin"]),
        format!("{}:644", data.len())
    );
    let (back, size, mode) = download_chunks(&peer, &kid, "data/sub/big.bin", MIB)
        .await
        .unwrap();
    assert_eq!((size, mode), (data.len() as u64, 0o644));
    assert!(back == data, "the same bytes back");

    // While an upload is in flight, its data goes to a hidden file beside the old one (the
    // engine's archive API would write no such file: this is the direct path).
    std::fs::write(work.join("keep.txt"), b"old").unwrap();
    let id = format!("up-{}", run_id());
    let opts = |eof: bool, size: Option<u64>| {
        let mut o = vec![("upload_id", Value::from(id.as_str())), ("eof", eof.into())];
        o.extend(size.map(|s| ("size", Value::from(s))));
        map(o)
    };
    let half = noise(MIB as usize, 11);
    let first = call(
        &peer,
        "upload_file",
        vec![
            kid.as_str().into(),
            "keep.txt".into(),
            Value::Binary(half.clone()),
            opts(false, Some(2 * MIB)),
        ],
    )
    .await;
    assert!(first.is_ok(), "{first:?}");
    let names = |dir: &std::path::Path| {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    };
    let during = names(&work);
    assert_eq!(during.len(), 3, "{during:?}");
    assert!(during[0].starts_with(".keep.txt.kv-upload-"), "{during:?}");
    assert_eq!(std::fs::read(work.join("keep.txt")).unwrap(), b"old");
    let last = call(
        &peer,
        "upload_file",
        vec![
            kid.as_str().into(),
            "keep.txt".into(),
            Value::Binary(half.clone()),
            opts(true, None),
        ],
    )
    .await;
    assert!(last.is_ok(), "{last:?}");
    assert_eq!(names(&work), vec!["data", "keep.txt"]);
    assert_eq!(
        std::fs::read(work.join("keep.txt")).unwrap(),
        [&half[..], &half[..]].concat()
    );

    // Chunks with offsets may come out of order (a caller with several in flight): the last
    // one, sent first, waits for the one before it.
    let id = format!("up-{}", run_id());
    let part = |i: u64| noise(MIB as usize, 20 + i);
    let chunk_call = |i: u64, first: bool, eof: bool| {
        let mut o = vec![
            ("upload_id", Value::from(id.as_str())),
            ("eof", eof.into()),
            ("offset", (i * MIB).into()),
        ];
        if first {
            o.push(("size", (3 * MIB).into()));
        }
        call(
            &peer,
            "upload_file",
            vec![
                kid.as_str().into(),
                "ordered.bin".into(),
                Value::Binary(part(i)),
                map(o),
            ],
        )
    };
    let r0 = chunk_call(0, true, false).await;
    assert!(r0.is_ok(), "{r0:?}");
    let (r2, r1) = futures::join!(chunk_call(2, false, true), chunk_call(1, false, false));
    assert_eq!(field(&r2.unwrap(), "received").as_u64(), Some(3 * MIB));
    assert_eq!(field(&r1.unwrap(), "received").as_u64(), Some(2 * MIB));
    assert_eq!(
        std::fs::read(work.join("ordered.bin")).unwrap(),
        [part(0), part(1), part(2)].concat()
    );
    std::fs::remove_file(work.join("ordered.bin")).unwrap();

    // Cut short: refused, the old file kept, nothing left beside it.
    std::fs::write(work.join("keep.txt"), b"old").unwrap();
    let part = vec![noise(MIB as usize, 9)];
    let short = upload_chunks(&peer, &kid, "keep.txt", &part, 3 * MIB).await;
    assert_eq!(failure_name(&short), "UploadSizeMismatch", "{short:?}");
    assert_eq!(std::fs::read(work.join("keep.txt")).unwrap(), b"old");
    assert_eq!(names(&work), vec!["data", "keep.txt"]);

    // A link to /etc made by the kernel: refused both ways, nothing written on the host.
    docker(&["exec", &cid, "ln", "-s", "/etc", "/home/work/etc"]);
    let up = upload_chunks(&peer, &kid, "etc/kv-direct", &part, MIB).await;
    assert_eq!(failure_name(&up), "InvalidPath", "{up:?}");
    assert!(!std::path::Path::new("/etc/kv-direct").exists());
    let down = download_chunks(&peer, &kid, "etc/passwd", MIB).await;
    assert_eq!(failure_name(&down.map(|_| Value::Nil)), "InvalidPath");

    let r = call(&peer, "destroy_kernel", vec![kid.as_str().into()]).await;
    assert!(r.is_ok(), "{r:?}");
}
