//! What the benchmarks share: medians, repeated timings after a warm-up, the time to first
//! token of a request from an empty cache, GPU profiles as JSON.

use std::time::Instant;

use futures::StreamExt;
use wgemma::{Event, GenerateRequest, Session};

use crate::TaskError;

/// The median of `v`; NaN for none (a benchmark that timed nothing prints that rather than
/// panicking).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs `f` `reps + 1` times: the first run's milliseconds (the warm-up), and each later one's.
pub fn timed_reps(
    reps: usize,
    mut f: impl FnMut() -> Result<(), TaskError>,
) -> Result<(f64, Vec<f64>), TaskError> {
    let mut ms = Vec::with_capacity(reps + 1);
    for _ in 0..reps + 1 {
        let t = Instant::now();
        f()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let first = ms.remove(0);
    Ok((first, ms))
}

/// Median time to the first token of `request()` (one token asked for), and the encode's
/// part of it, each from an empty cache, over `reps` runs after a warm-up.
pub fn first_token_ms(
    session: &mut Session,
    reps: usize,
    request: impl Fn() -> GenerateRequest,
) -> Result<(f64, f64), TaskError> {
    let (mut ttft, mut enc) = (Vec::new(), Vec::new());
    for _ in 0..reps + 1 {
        pollster::block_on(session.reset())?;
        let mut req = request();
        req.max_tokens = 1;
        let mut stream = Box::pin(session.generate(req));
        while let Some(e) = pollster::block_on(stream.next()) {
            if let Event::Done { timings, .. } = e? {
                ttft.push(timings.prompt_ms);
                enc.push(timings.encode_ms);
            }
        }
    }
    ttft.remove(0);
    enc.remove(0);
    Ok((median(ttft), median(enc)))
}

/// A GPU profile (kernel, dispatches, microseconds) as JSON rows, or null.
pub fn profile_json(profile: Option<Vec<(&'static str, usize, f64)>>) -> serde_json::Value {
    profile.map_or(serde_json::Value::Null, |k| {
        k.iter()
            .map(|(n, c, us)| serde_json::json!([n, c, us]))
            .collect()
    })
}

/// Prints a benchmark's result: one JSON line with `json`, else indented.
pub fn print(out: &serde_json::Value, json: bool) -> Result<(), TaskError> {
    if json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(out)?);
    }
    Ok(())
}
