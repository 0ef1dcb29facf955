//! What the agent's NVML paths see on this machine: `cargo run --release --example nvml_probe`.
//!
//! The `cuda` accelerator's detection (`Cuda::detect`: one `cuda.device` per GPU, with its model
//! and memory) and the stats sampler's readings (`GpuSampler::sample`: utilization %, memory in
//! bytes, temperature °C, power W), `KV_PROBE_SAMPLES` (3) samples a second apart. Prints a
//! table per sample and ends with one JSON line of the last. Without NVML or without a GPU it
//! says so and exits 0 (what an agent does: no `cuda.device` slots, no GPU metrics).

use std::time::Duration;

use kernelvisor::agent::accelerators::cuda::Cuda;
use kernelvisor::agent::accelerators::Accelerator;
use kernelvisor::agent::stats::gpu::GpuSampler;

fn main() {
    let sampler = GpuSampler::init();
    if !sampler.available() {
        println!("NVML is unavailable here: an agent would offer no cuda.device slots and no GPU metrics");
        println!("{{\"nvml\": false, \"gpus\": []}}");
        return;
    }
    let Some(cuda) = Cuda::detect() else {
        println!("NVML answers but finds no GPU: no cuda.device slots");
        println!("{{\"nvml\": true, \"gpus\": []}}");
        return;
    };
    println!(
        "detected ({} {} slot(s)):",
        cuda.devices().len(),
        cuda.name()
    );
    for d in cuda.devices() {
        println!(
            "  device {:>2}  {:<12} {:<40} {:>8.1} GiB",
            d.id,
            d.slot,
            d.model,
            d.memory as f64 / (1u64 << 30) as f64
        );
    }
    println!("slot types: {:?}", cuda.slot_types());
    let samples: usize = std::env::var("KV_PROBE_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut last = Vec::new();
    for i in 0..samples.max(1) {
        if i > 0 {
            std::thread::sleep(Duration::from_secs(1));
        }
        last = sampler.sample();
        println!("sample {}:", i + 1);
        println!(
            "  {:>3} {:<44} {:>7} {:>12} {:>12} {:>7} {:>8}",
            "idx", "uuid", "util %", "mem used MiB", "mem total MiB", "temp C", "power W"
        );
        for g in &last {
            println!(
                "  {:>3} {:<44} {:>7.1} {:>12.1} {:>12.1} {:>7.1} {:>8.1}",
                g.index,
                g.uuid,
                g.util_pct,
                g.mem_used_bytes as f64 / (1u64 << 20) as f64,
                g.mem_total_bytes as f64 / (1u64 << 20) as f64,
                g.temperature_c,
                g.power_w
            );
        }
        for s in cuda.sample() {
            println!(
                "  accelerator sample: device {} util {:.1} % mem {} / {} bytes",
                s.id, s.utilization_pct, s.mem_used_bytes, s.mem_total_bytes
            );
        }
    }
    let gpus: Vec<String> = last
        .iter()
        .map(|g| {
            format!(
                "{{\"index\": {}, \"uuid\": \"{}\", \"name\": \"{}\", \"util_pct\": {}, \"mem_used_bytes\": {}, \"mem_total_bytes\": {}, \"temperature_c\": {}, \"power_w\": {}}}",
                g.index,
                g.uuid,
                g.name,
                json_number(g.util_pct),
                g.mem_used_bytes,
                g.mem_total_bytes,
                json_number(g.temperature_c),
                json_number(g.power_w)
            )
        })
        .collect();
    println!("{{\"nvml\": true, \"gpus\": [{}]}}", gpus.join(", "));
}

/// A reading as JSON: `null` for NaN (not supported by the device).
fn json_number(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}
