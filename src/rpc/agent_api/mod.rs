//! The typed agent contract: every method the agent serves, with the serde types of its
//! arguments and reply, named and shaped as Backend.AI 26.x names them
//! (`ai.backend.agent.server.AgentRPCServer`, `ai.backend.common.types`,
//! `ai.backend.common.dto.agent` in lablup/backend.ai). The agent's handlers decode calls into
//! these types ([`decode_args`]) and the manager builds its calls from them ([`encode_args`]), so
//! the two ends cannot drift apart.
//!
//! One module per family:
//! - [`kernel`]: `create_kernels`, `destroy_kernel`, `restart_kernel`, `check_*`,
//!   `sync_kernel_registry`, and the kernel config types (`KernelCreationConfig`, `ImageConfig`,
//!   `ImageRef`, `ClusterInfo`, `VFolderMount`, `KernelCreationResult`).
//! - [`exec`]: `execute`, `trigger_batch_execution`, `interrupt_kernel`, `get_completions`,
//!   `get_logs`.
//! - [`node`]: `ping`, `health`/`health_v2`, `gather_hwinfo`/`gather_hwinfo_v2`,
//!   `get_local_config`, `scan_gpu_alloc_map`, `reset_agent`, `shutdown_agent`.
//! - [`network`]: `create_local_network`, `destroy_local_network`, `assign_port`, `release_port`.
//! - [`services`]: `start_service`, `shutdown_service`.
//! - [`files`]: `upload_file`, `download_file`, `download_single`, `list_files`.
//! - [`images`]: `check_and_pull`, `purge_images`, `commit`, `get_commit_status`, `push_image`.
//! - [`terminal`] (kernelvisor's own): `pty_start`, `pty_read`, `pty_write`, `pty_resize`,
//!   `pty_close`.
//!
//! Decoding tolerates unknown keys (a newer manager adds fields); a missing required one is an
//! error naming it. Values arrive with Backend.AI's msgpack ext types already turned into plain
//! values by the codec (UUIDs and paths as strings, enums as their values, `ImageRef` as a map).

pub mod exec;
pub mod files;
pub mod images;
pub mod kernel;
pub mod network;
pub mod node;
pub mod services;
pub mod terminal;

use rmpv::Value;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::codec::Call;

/// One RPC method of the agent: its wire name, its parameters in upstream's positional order
/// (positional argument `i` is parameter `PARAMS[i]`; keyword arguments by name), and the
/// types of its arguments and reply.
pub trait Method {
    /// The callosum method name.
    const NAME: &'static str;
    /// Parameter names in upstream's order, without the trailing `agent_id`.
    const PARAMS: &'static [&'static str];
    /// The arguments, a struct whose fields are named as `PARAMS`.
    type Args: Serialize + DeserializeOwned;
    /// The RESULT value.
    type Reply: Serialize + DeserializeOwned;
}

/// Why a call's arguments or a reply did not decode into their types: the serde message, which
/// names the missing or mistyped field (`missing field `image``).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

/// Any serializable value as msgpack with named fields (structs as maps, as Python packs its
/// dicts). `rmpv::ext::to_value` writes structs as arrays, which no Python peer reads.
pub fn to_value<T: Serialize + ?Sized>(value: &T) -> Value {
    let bytes = rmp_serde::to_vec_named(value).expect("serializing to a Vec cannot fail");
    super::codec::from_msgpack(&bytes).expect("rmp_serde writes valid msgpack")
}

/// A plain msgpack value as `T`. Unknown map keys are ignored unless `T` says otherwise.
///
/// Errors: [`DecodeError`] with serde's message (missing field, wrong type).
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, DecodeError> {
    // Through bytes: rmp_serde reads a unit enum variant from its name (as Python sends an
    // enum's value), which `rmpv::ext::from_value` does not.
    let bytes = super::codec::to_msgpack(&value);
    rmp_serde::from_slice(&bytes).map_err(|e| DecodeError(e.to_string()))
}

/// The arguments of `call` as `M::Args`: positional argument `i` named `M::PARAMS[i]`, then the
/// keyword arguments (a keyword overrides nothing positional; `agent_id` is the dispatcher's).
///
/// Errors: [`DecodeError`] naming a missing or mistyped parameter, or too many positional ones.
pub fn decode_args<M: Method>(call: &Call) -> Result<M::Args, DecodeError> {
    if call.args.len() > M::PARAMS.len() {
        return Err(DecodeError(format!(
            "{}() takes {} positional arguments but {} were given",
            M::NAME,
            M::PARAMS.len(),
            call.args.len()
        )));
    }
    let mut map: Vec<(Value, Value)> = M::PARAMS
        .iter()
        .zip(&call.args)
        .map(|(name, v)| (Value::from(*name), v.clone()))
        .collect();
    for (k, v) in &call.kwargs {
        if k == "agent_id" || map.iter().any(|(n, _)| n.as_str() == Some(k)) {
            continue;
        }
        map.push((Value::from(k.as_str()), v.clone()));
    }
    from_value(Value::Map(map))
}

/// `args` as a call with every parameter positional, in `M::PARAMS` order (nil where absent).
pub fn encode_args<M: Method>(args: &M::Args) -> Call {
    let (args, _) = split_args::<M>(args);
    Call {
        args,
        ..Call::default()
    }
}

/// As [`encode_args`] for a method with keyword-only parameters (upstream's `commit`:
/// `canonical`, `filename`, `extra_labels` after a `*`): the fields named in `M::PARAMS` go
/// positional in that order, every other field that is not nil as a keyword argument.
pub fn encode_args_with_kwargs<M: Method>(args: &M::Args) -> Call {
    let (args, rest) = split_args::<M>(args);
    Call {
        args,
        kwargs: rest
            .into_iter()
            .filter(|(_, v)| !v.is_nil())
            .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v)))
            .collect(),
        ..Call::default()
    }
}

/// `args`' fields named in `M::PARAMS`, in that order (nil for a missing one), and the rest.
fn split_args<M: Method>(args: &M::Args) -> (Vec<Value>, Vec<(Value, Value)>) {
    let Value::Map(mut fields) = to_value(args) else {
        panic!("{}: Args must serialize as a map", M::NAME);
    };
    let positional = M::PARAMS
        .iter()
        .map(|name| {
            fields
                .iter()
                .position(|(k, _)| k.as_str() == Some(name))
                .map(|i| fields.swap_remove(i).1)
                .unwrap_or(Value::Nil)
        })
        .collect();
    (positional, fields)
}

/// A RESULT value as `M::Reply`.
pub fn decode_reply<M: Method>(value: Value) -> Result<M::Reply, DecodeError> {
    from_value(value).map_err(|e| DecodeError(format!("{} reply: {e}", M::NAME)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Args {
        kernel_id: String,
        #[serde(default)]
        reason: Option<String>,
        #[serde(default)]
        suppress_events: bool,
    }
    struct Destroy;
    impl Method for Destroy {
        const NAME: &'static str = "destroy";
        const PARAMS: &'static [&'static str] = &["kernel_id", "reason", "suppress_events"];
        type Args = Args;
        type Reply = ();
    }

    #[test]
    fn positional_and_keyword_arguments_decode_by_name() {
        let call = Call {
            args: vec!["k1".into()],
            kwargs: vec![
                ("suppress_events".into(), true.into()),
                ("agent_id".into(), "a".into()),
                ("newer_manager_field".into(), 3.into()),
            ],
            peer_user_id: None,
        };
        let args = decode_args::<Destroy>(&call).unwrap();
        assert_eq!(
            args,
            Args {
                kernel_id: "k1".into(),
                reason: None,
                suppress_events: true
            }
        );
        let back = encode_args::<Destroy>(&args);
        assert_eq!(back.args, vec![Value::from("k1"), Value::Nil, true.into()]);
        assert_eq!(decode_args::<Destroy>(&back).unwrap(), args);
    }

    #[test]
    fn a_missing_or_extra_parameter_is_named() {
        let e = decode_args::<Destroy>(&Call::default()).unwrap_err();
        assert!(e.0.contains("kernel_id"), "{e}");
        let call = Call {
            args: vec!["k".into(), Value::Nil, false.into(), 4.into()],
            ..Call::default()
        };
        let e = decode_args::<Destroy>(&call).unwrap_err();
        assert!(e.0.contains("3 positional arguments but 4"), "{e}");
    }
}
