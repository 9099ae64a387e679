//! An event stream reader: follows a random session's `/events/stream` on the next instance for
//! a moment, then another, resuming each after the last id it saw (`?after=`). Each stored event
//! comes once and in order: every id is greater than the one before it in that session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;

use super::cluster::Cluster;
use super::Rng;

/// What the reader saw.
#[derive(Default, Debug)]
pub struct Watched {
    pub streams: u64,
    pub events: u64,
    /// Ids that came again or out of order, with the one before them.
    pub regressions: Vec<String>,
}

pub async fn run(
    cluster: Arc<Cluster>,
    sessions: Arc<Mutex<Vec<String>>>,
    mut rng: Rng,
    until: Instant,
) -> Watched {
    let mut out = Watched::default();
    let mut last: HashMap<String, String> = HashMap::new();
    while Instant::now() < until {
        let picked = {
            let s = sessions.lock().unwrap();
            (!s.is_empty()).then(|| s[rng.below(s.len() as u64) as usize].clone())
        };
        let Some(sid) = picked else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let after = last
            .get(&sid)
            .map(|id| format!("?after={id}"))
            .unwrap_or_default();
        let path = format!("/sessions/{sid}/events/stream{after}");
        let resp = match cluster.send_raw("GET", &path, None, None).await.1 {
            Ok(resp) if resp.status() == 200 => resp,
            _ => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        out.streams += 1;
        let stop = tokio::time::Instant::now() + rng.millis(300, 2000);
        let mut body = resp.into_body();
        let mut buf = Vec::new();
        while let Ok(Some(Ok(frame))) = tokio::time::timeout_at(stop, body.frame()).await {
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            while let Some(pos) = buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = buf.drain(..pos + 2).collect();
                let block = String::from_utf8_lossy(&block);
                for id in block.lines().filter_map(|l| l.strip_prefix("id: ")) {
                    out.events += 1;
                    if let Some(prev) = last.get(&sid).filter(|prev| id <= prev.as_str()) {
                        out.regressions
                            .push(format!("{sid}: {id} came after {prev}"));
                    }
                    last.insert(sid.clone(), id.to_string());
                }
            }
        }
    }
    out
}
