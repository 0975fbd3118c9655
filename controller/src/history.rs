//! Each experiment's evidence table at every tick of its current run, so the console can
//! draw the always-valid interval of treatment - control over time (what the controller
//! saw when, not a re-computation).
//!
//! Bounded ([`POINTS`] per experiment, the newest kept) and kept in
//! `controller-history.json`, rewritten atomically after each tick. It is a view: a file
//! that does not decode is set aside with a warning and the history starts again, rather
//! than stopping the controller.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::decide::Row;

/// The file beside the controller's state.
pub const HISTORY_FILE: &str = "controller-history.json";

/// Points kept per experiment: a day of ticks at the default 5-minute interval.
pub const POINTS: usize = 288;

/// One tick's evidence table for one experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Point {
    /// RFC 3339, UTC.
    pub at: String,
    pub run: u64,
    pub rows: Vec<Row>,
}

/// Every experiment's points of its current run, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct History(BTreeMap<String, VecDeque<Point>>);

impl History {
    /// Add a tick's table. A new run starts the experiment's history again.
    pub fn push(&mut self, experiment: &str, point: Point) {
        let points = self.0.entry(experiment.to_string()).or_default();
        if points.back().is_some_and(|p| p.run != point.run) {
            points.clear();
        }
        points.push_back(point);
        while points.len() > POINTS {
            points.pop_front();
        }
    }

    /// Drop the experiments not in `keep` (no longer running).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.0.retain(|name, _| keep(name));
    }

    pub fn points(&self, experiment: &str) -> Vec<Point> {
        self.0
            .get(experiment)
            .map(|p| p.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The history in `data_dir`, or an empty one (with a warning if a file was there
    /// but did not decode; it is renamed `.refused` so nothing is lost).
    pub fn load(data_dir: &Path) -> History {
        let path = data_dir.join(HISTORY_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(_) => return History::default(),
        };
        match serde_json::from_slice(&bytes) {
            Ok(h) => h,
            Err(e) => {
                let aside = refused(&path);
                tracing::warn!(file = %path.display(), error = %e, aside = %aside.display(), "controller history does not decode; starting it again");
                let _ = std::fs::rename(&path, aside);
                History::default()
            }
        }
    }

    pub fn save(&self, data_dir: &Path) {
        let path = data_dir.join(HISTORY_FILE);
        match serde_json::to_vec(self) {
            Ok(bytes) => {
                if let Err(e) = halo_fsutil::write_atomic(&path, &bytes, 0o644) {
                    tracing::warn!(error = %e, "cannot write the controller history");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot encode the controller history"),
        }
    }
}

fn refused(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".refused");
    PathBuf::from(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(run: u64, i: usize) -> Point {
        Point {
            at: format!("2026-12-01T00:{:02}:00Z", i % 60),
            run,
            rows: Vec::new(),
        }
    }

    #[test]
    fn keeps_the_newest_points_of_the_current_run_and_survives_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = History::default();
        for i in 0..POINTS + 5 {
            h.push("e", point(1, i));
        }
        assert_eq!(h.points("e").len(), POINTS);
        assert_eq!(h.points("e")[0], point(1, 5));
        h.push("e", point(2, 0));
        assert_eq!(h.points("e"), vec![point(2, 0)]);
        h.save(dir.path());
        assert_eq!(History::load(dir.path()), h);
        std::fs::write(dir.path().join(HISTORY_FILE), b"{\"e\": 1}").unwrap();
        assert_eq!(History::load(dir.path()), History::default());
        assert!(dir.path().join("controller-history.json.refused").exists());
    }
}
