//! The shared buffer between the master and its workers: a folder (AIPerf's workers share a
//! file system too, for the models), so that one protocol serves worker threads in one process
//! and teams of MPI ranks on many nodes alike.
//!
//! - The master writes each trial as `queue/<id>.json` (atomically); a worker claims it by
//!   renaming it to `taken/<id>.json` (only one rename succeeds).
//! - A worker appends its events, one JSON line each, to `events/<worker>.jsonl` (a heartbeat a
//!   second while it trains, every finished epoch, the trial's end); the master reads what is
//!   new.
//! - The master ends the run by creating `stop`.

use super::worker::{Event, Trial};
use crate::layers::Reducer;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The buffer's folder.
#[derive(Clone, Debug)]
pub struct Folder(pub PathBuf);

impl Folder {
    fn queue(&self) -> PathBuf {
        self.0.join("queue")
    }
    fn taken(&self) -> PathBuf {
        self.0.join("taken")
    }
    fn events(&self) -> PathBuf {
        self.0.join("events")
    }
    fn stop_file(&self) -> PathBuf {
        self.0.join("stop")
    }

    /// A fresh buffer: what an earlier run left is removed.
    pub fn create(&self) -> std::io::Result<()> {
        for d in [self.queue(), self.taken(), self.events()] {
            if d.exists() {
                std::fs::remove_dir_all(&d)?;
            }
            std::fs::create_dir_all(&d)?;
        }
        match std::fs::remove_file(self.stop_file()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    pub fn stopped(&self) -> bool {
        self.stop_file().exists()
    }
}

fn io(what: &str, p: &Path, e: impl std::fmt::Display) -> String {
    format!("the shared buffer: {what} {}: {e}", p.display())
}

/// The master's side.
pub struct Master {
    folder: Folder,
    /// Bytes of each worker's events file read so far, and an unfinished last line (bytes: a
    /// line may be caught half-written, in the middle of a character).
    read: BTreeMap<PathBuf, (u64, Vec<u8>)>,
    pending: std::collections::VecDeque<Event>,
}

impl Master {
    pub fn new(folder: Folder) -> Master {
        Master {
            folder,
            read: BTreeMap::new(),
            pending: Default::default(),
        }
    }

    pub fn hand(&mut self, t: &Trial) -> Result<(), String> {
        let path = self.folder.queue().join(format!("{}.json", t.id));
        let text = serde_json::to_string(t).map_err(|e| io("cannot write", &path, e))?;
        roofline_model::write::write_atomic(&path, text.as_bytes())
            .map_err(|e| io("cannot write", &path, e))
    }

    /// Takes back a trial no worker took (the run ended).
    pub fn withdraw(&mut self, id: usize) {
        let _ = std::fs::remove_file(self.folder.queue().join(format!("{id}.json")));
    }

    /// The next event, waiting up to `wait` for one.
    pub fn next(&mut self, wait: Duration) -> Result<Option<Event>, String> {
        if self.pending.is_empty() {
            self.poll()?;
        }
        if self.pending.is_empty() {
            std::thread::sleep(wait);
            self.poll()?;
        }
        Ok(self.pending.pop_front())
    }

    fn poll(&mut self) -> Result<(), String> {
        let dir = self.folder.events();
        let entries = std::fs::read_dir(&dir).map_err(|e| io("cannot read", &dir, e))?;
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files
            .into_iter()
            .filter(|f| f.extension().is_some_and(|x| x == "jsonl"))
        {
            let (offset, partial) = self.read.entry(f.clone()).or_default();
            let mut file = std::fs::File::open(&f).map_err(|e| io("cannot read", &f, e))?;
            file.seek(SeekFrom::Start(*offset))
                .map_err(|e| io("cannot read", &f, e))?;
            let mut new = Vec::new();
            let n = file
                .read_to_end(&mut new)
                .map_err(|e| io("cannot read", &f, e))?;
            *offset += n as u64;
            partial.extend_from_slice(&new);
            while let Some(end) = partial.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = partial.drain(..=end).collect();
                let e: Event = serde_json::from_slice(&line[..end])
                    .map_err(|e| io("a bad event in", &f, e))?;
                self.pending.push_back(e);
            }
        }
        Ok(())
    }

    pub fn stop(&self) {
        let _ = std::fs::write(self.folder.stop_file(), b"stop\n");
    }
}

/// A worker's side: the team's root claims trials and writes events; with a team, every rank
/// learns the claimed trial from the root.
pub struct Link {
    folder: Folder,
    worker: usize,
    team: Option<Arc<dyn Reducer>>,
    events: Mutex<Option<std::fs::File>>,
    /// Set when the master has created `stop` (polled by a thread while the worker trains).
    pub stop: Arc<AtomicBool>,
}

impl Link {
    pub fn new(folder: Folder, worker: usize, team: Option<Arc<dyn Reducer>>) -> Link {
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (folder.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                if f.stopped() {
                    s.store(true, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Link {
            folder,
            worker,
            team,
            events: Mutex::new(None),
            stop,
        }
    }

    fn root(&self) -> bool {
        self.team.as_ref().is_none_or(|t| t.rank() == 0)
    }

    /// The team's reducer (data parallel inside the team), if the worker is a team.
    pub fn team(&self) -> Option<Arc<dyn Reducer>> {
        self.team.clone()
    }

    /// The root's claim: the lowest queued trial it could rename, or None once stopped.
    fn claim(&self) -> Option<usize> {
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return None;
            }
            let mut ids: Vec<usize> = std::fs::read_dir(self.folder.queue())
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    name.strip_suffix(".json")?.parse().ok()
                })
                .collect();
            ids.sort_unstable();
            for id in ids {
                let from = self.folder.queue().join(format!("{id}.json"));
                let to = self.folder.taken().join(format!("{id}.json"));
                if std::fs::rename(&from, &to).is_ok() {
                    return Some(id);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The next trial for this worker (every rank of its team gets the same), or None when
    /// the run is over.
    pub fn take(&self) -> Result<Option<Trial>, String> {
        let mut id = if self.root() { self.claim() } else { None };
        if let Some(team) = &self.team {
            // The root's claim to every rank: id + 1, 0 for none.
            let mut v = [id.map_or(0.0, |i| i as f64 + 1.0)];
            team.sum_f64(&mut v);
            id = (v[0] > 0.0).then(|| v[0] as usize - 1);
        }
        let Some(id) = id else { return Ok(None) };
        let path = self.folder.taken().join(format!("{id}.json"));
        let text = std::fs::read_to_string(&path).map_err(|e| io("cannot read", &path, e))?;
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| io("a bad trial in", &path, e))
    }

    /// Appends `e` to this worker's events (the root's only).
    pub fn send(&self, e: &Event) {
        if !self.root() {
            return;
        }
        let mut f = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            let path = self.folder.events().join(format!("{}.jsonl", self.worker));
            *f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .ok();
        }
        if let (Some(file), Ok(mut line)) = (f.as_mut(), serde_json::to_string(e)) {
            line.push('\n');
            // One write of the whole line: the master never sees half of one from this
            // writer (it keeps an unfinished line until its end arrives).
            let _ = file.write_all(line.as_bytes());
        }
    }

    /// Every rank of the team waits for the others (after the root wrote a checkpoint).
    pub fn team_barrier(&self) {
        if let Some(t) = &self.team {
            let mut v = [0.0];
            t.sum_f64(&mut v);
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Ends the stop poller.
        self.stop.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roofline_model::automl::Outcome;

    /// A trial is claimed once; the master reads events whole, also a line caught half-written
    /// in the middle of a character; `stop` reaches the workers.
    #[test]
    fn claims_once_and_reads_whole_events() {
        let dir = std::env::temp_dir().join(format!("roofline-buffer-{}", std::process::id()));
        let folder = Folder(dir.clone());
        folder.create().unwrap();
        let mut master = Master::new(folder.clone());
        let trial: Trial = serde_json::from_value(serde_json::json!({
            "id": 7, "parent": null, "morphisms": [], "description": {"channels": 3, "nodes": []},
            "batch": 8, "kernel": 3, "epochs": 1, "patience": 2, "final_epochs": 1,
            "checkpoint": "x.safetensors", "seed": 1, "train_ops": 1.0, "eval_ops": 1.0
        }))
        .unwrap();
        master.hand(&trial).unwrap();
        let (a, b) = (
            Link::new(folder.clone(), 0, None),
            Link::new(folder.clone(), 1, None),
        );
        assert_eq!(a.take().unwrap().map(|t| t.id), Some(7));
        // The other finds nothing until the run stops.
        master.stop();
        assert!(b.take().unwrap().is_none());
        let done = Event::Done {
            worker: 0,
            trial: 7,
            outcome: Outcome::Failed {
                why: "naïve × 2".into(),
            },
            predicted: None,
            train_seconds: 1.0,
        };
        let mut line = serde_json::to_vec(&done).unwrap();
        line.push(b'\n');
        let cut = line.iter().position(|&c| c == 0xC3).unwrap() + 1;
        let path = dir.join("events").join("3.jsonl");
        std::fs::write(&path, &line[..cut]).unwrap();
        assert!(
            master.next(Duration::ZERO).unwrap().is_none(),
            "half a line is no event"
        );
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(&line[cut..]).unwrap();
        match master.next(Duration::ZERO).unwrap() {
            Some(Event::Done {
                outcome: Outcome::Failed { why },
                ..
            }) => assert_eq!(why, "naïve × 2"),
            e => panic!("{e:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
