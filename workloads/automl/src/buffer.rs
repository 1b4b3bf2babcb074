//! The shared buffer between the master and its workers: a folder (AIPerf's workers share a
//! file system too, for the models), so that one protocol serves worker threads in one process
//! and teams of MPI ranks on many nodes alike.
//!
//! - The master writes the search's plan as `plan.json` before the workers start.
//! - A worker proposes its next candidate as an event (below); the master answers in
//!   `acks/<worker>-<seq>.json`: the trial's id (the trial written as `taken/<id>.json`), a
//!   refusal (the network is taken: the worker searches again on the newer history), wait, or
//!   stop.
//! - A trial the master hands out again (its worker failed or stalled) goes to
//!   `queue/<id>.json` (atomically); a worker claims it by renaming it to `taken/<id>.json`
//!   (only one rename succeeds), before it proposes.
//! - A worker appends its events, one JSON line each, to `events/<worker>.jsonl` (its
//!   proposals, a heartbeat a second while it trains, every finished epoch, the trial's end);
//!   the master reads what is new.
//! - The master ends the run by creating `stop`.

use crate::propose::{Plan, Proposal};
use crate::worker::{Event, Trial};
use roofline_model::automl::Candidate;
use roofline_workloads::layers::Reducer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The master's answer to a proposal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ack {
    /// Recorded as this candidate: train it.
    Trial(usize),
    /// Not recorded (why): search again.
    Rejected(String),
    /// The worker has nothing to propose but others train: ask again later.
    Wait,
    /// The run is over.
    Stop,
}

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
    fn acks(&self) -> PathBuf {
        self.0.join("acks")
    }
    fn plan_file(&self) -> PathBuf {
        self.0.join("plan.json")
    }
    /// The history as the workers read it: every candidate's latest state, one JSON line each
    /// time it changes (recorded, ended), appended by the master.
    pub fn history_log(&self) -> PathBuf {
        self.0.join("history.jsonl")
    }

    /// A fresh buffer: what an earlier run left is removed.
    pub fn create(&self) -> std::io::Result<()> {
        for d in [self.queue(), self.taken(), self.events(), self.acks()] {
            if d.exists() {
                std::fs::remove_dir_all(&d)?;
            }
            std::fs::create_dir_all(&d)?;
        }
        for f in [self.stop_file(), self.plan_file(), self.history_log()] {
            match std::fs::remove_file(f) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    pub fn stopped(&self) -> bool {
        self.stop_file().exists()
    }
}

fn io(what: &str, p: &Path, e: impl std::fmt::Display) -> String {
    format!("the shared buffer: {what} {}: {e}", p.display())
}

/// The new whole lines of a file others append to: what was read so far, and an unfinished
/// last line (bytes: a line may be caught half-written, in the middle of a character).
#[derive(Default)]
pub struct Tail {
    offset: u64,
    partial: Vec<u8>,
}

impl Tail {
    /// Each complete line appended to `path` since the last call (none while it is missing).
    pub fn lines(&mut self, path: &Path) -> Result<Vec<Vec<u8>>, String> {
        let mut file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("cannot read", path, e)),
        };
        file.seek(SeekFrom::Start(self.offset))
            .map_err(|e| io("cannot read", path, e))?;
        let mut new = Vec::new();
        let n = file
            .read_to_end(&mut new)
            .map_err(|e| io("cannot read", path, e))?;
        self.offset += n as u64;
        self.partial.extend_from_slice(&new);
        let mut lines = Vec::new();
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.partial.drain(..=end).collect();
            line.pop();
            lines.push(line);
        }
        Ok(lines)
    }
}

/// Appends `line` and a newline in one write (a reader never sees half of it from this
/// writer: it keeps an unfinished line until its end arrives).
fn append(file: &mut Option<std::fs::File>, path: &Path, line: &[u8]) -> Result<(), String> {
    if file.is_none() {
        *file = Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| io("cannot write", path, e))?,
        );
    }
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line);
    bytes.push(b'\n');
    file.as_mut()
        .expect("opened above")
        .write_all(&bytes)
        .map_err(|e| io("cannot write", path, e))
}

/// The master's side.
pub struct Master {
    folder: Folder,
    /// Each worker's events file as read so far.
    read: BTreeMap<PathBuf, Tail>,
    /// The history log, open for appending.
    log: Option<std::fs::File>,
    pending: std::collections::VecDeque<Event>,
    /// Time spent waiting for events.
    slept: Duration,
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<(), String> {
    let text = serde_json::to_string(v).map_err(|e| io("cannot write", path, e))?;
    roofline_model::write::write_atomic(path, text.as_bytes())
        .map_err(|e| io("cannot write", path, e))
}

impl Master {
    pub fn new(folder: Folder) -> Master {
        Master {
            folder,
            read: BTreeMap::new(),
            log: None,
            pending: Default::default(),
            slept: Duration::ZERO,
        }
    }

    /// The search's plan, for every worker.
    pub fn plan(&mut self, p: &Plan) -> Result<(), String> {
        write_json(&self.folder.plan_file(), p)
    }

    /// A trial any worker may take (one handed out again).
    pub fn hand(&mut self, t: &Trial) -> Result<(), String> {
        write_json(&self.folder.queue().join(format!("{}.json", t.id)), t)
    }

    /// A trial for the worker that proposed it (answered with `Ack::Trial`).
    pub fn assign(&mut self, t: &Trial) -> Result<(), String> {
        write_json(&self.folder.taken().join(format!("{}.json", t.id)), t)
    }

    /// The answer to proposal `seq` of `worker`.
    pub fn ack(&mut self, worker: usize, seq: usize, a: &Ack) -> Result<(), String> {
        write_json(&self.folder.acks().join(format!("{worker}-{seq}.json")), a)
    }

    /// Time spent waiting for events so far.
    pub fn slept(&self) -> Duration {
        self.slept
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
            let t0 = Instant::now();
            std::thread::sleep(wait);
            self.slept += t0.elapsed();
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
            let lines = self.read.entry(f.clone()).or_default().lines(&f)?;
            for line in lines {
                let e: Event =
                    serde_json::from_slice(&line).map_err(|e| io("a bad event in", &f, e))?;
                self.pending.push_back(e);
            }
        }
        Ok(())
    }

    /// A candidate as it stands now, appended to the history log the workers search on (its
    /// record when it is handed out, again when it ends).
    pub fn log(&mut self, c: &Candidate) -> Result<(), String> {
        let path = self.folder.history_log();
        let line = serde_json::to_vec(c).map_err(|e| io("cannot write", &path, e))?;
        append(&mut self.log, &path, &line)
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
    /// Proposals sent so far.
    seq: std::sync::atomic::AtomicUsize,
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
            seq: Default::default(),
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

    /// The lowest queued trial the root could rename to taken.
    fn claim(&self) -> Option<usize> {
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
        ids.into_iter().find(|id| {
            let from = self.folder.queue().join(format!("{id}.json"));
            let to = self.folder.taken().join(format!("{id}.json"));
            std::fs::rename(&from, &to).is_ok()
        })
    }

    /// The search's plan, once the master has written it (under MPI the workers may start
    /// first); None if the run stops before.
    pub fn plan(&self) -> Result<Option<Plan>, String> {
        let path = self.folder.plan_file();
        while !path.is_file() {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| io("cannot read", &path, e))?;
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| io("a bad plan in", &path, e))
    }

    /// The master's answer to proposal `seq`, or `Stop` once the run is stopped.
    fn answer(&self, seq: usize) -> Result<Ack, String> {
        let path = self
            .folder
            .acks()
            .join(format!("{}-{seq}.json", self.worker));
        loop {
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    let _ = std::fs::remove_file(&path);
                    return serde_json::from_str(&text)
                        .map_err(|e| io("a bad answer in", &path, e));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("cannot read", &path, e)),
            }
            if self.stop.load(Ordering::SeqCst) {
                return Ok(Ack::Stop);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The root's next trial: one handed out again if queued, else its own proposal once the
    /// master records it (`propose`: the proposal and the seconds its search took, run again
    /// after a refusal); None once stopped.
    fn next_id(
        &self,
        propose: &mut dyn FnMut() -> Result<(Option<Proposal>, f64), String>,
    ) -> Result<Option<usize>, String> {
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(None);
            }
            if let Some(id) = self.claim() {
                return Ok(Some(id));
            }
            let (proposal, search_seconds) = propose()?;
            let seq = self.seq.fetch_add(1, Ordering::SeqCst);
            self.send(&Event::Proposed {
                worker: self.worker,
                seq,
                proposal,
                search_seconds,
            });
            match self.answer(seq)? {
                Ack::Trial(id) => return Ok(Some(id)),
                Ack::Rejected(_) => {}
                Ack::Wait => std::thread::sleep(Duration::from_millis(200)),
                Ack::Stop => return Ok(None),
            }
        }
    }

    /// The next trial for this worker (every rank of its team gets the same: the root's), or
    /// None when the run is over.
    pub fn take(
        &self,
        propose: &mut dyn FnMut() -> Result<(Option<Proposal>, f64), String>,
    ) -> Result<Option<Trial>, String> {
        let mut id = if self.root() {
            self.next_id(propose)?
        } else {
            None
        };
        if let Some(team) = &self.team {
            // The root's trial to every rank: id + 1, 0 for none.
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
        let path = self.folder.events().join(format!("{}.jsonl", self.worker));
        if let Ok(line) = serde_json::to_vec(e) {
            let _ = append(&mut f, &path, &line);
        }
    }

    /// The history log's path.
    pub fn history_log(&self) -> PathBuf {
        self.folder.history_log()
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

    fn trial(id: usize) -> Trial {
        serde_json::from_value(serde_json::json!({
            "id": id, "parent": null, "morphisms": [], "description": {"channels": 3, "nodes": []},
            "batch": 8, "kernel": 3, "epochs": 1, "patience": 2, "tune": null,
            "checkpoint": "x.safetensors", "seed": 1, "train_ops": 1.0, "eval_ops": 1.0
        }))
        .unwrap()
    }

    /// A trial handed out again is claimed once, before any proposal; a proposal the master
    /// refuses is searched again, one it records comes back as its trial; `stop` reaches the
    /// workers; the master reads events whole, also a line caught half-written in the middle
    /// of a character.
    #[test]
    fn claims_once_proposes_and_reads_whole_events() {
        let dir = std::env::temp_dir().join(format!("roofline-buffer-{}", std::process::id()));
        let folder = Folder(dir.clone());
        folder.create().unwrap();
        let mut master = Master::new(folder.clone());
        master.hand(&trial(7)).unwrap();
        let (a, b) = (
            Link::new(folder.clone(), 0, None),
            Link::new(folder.clone(), 1, None),
        );
        let mut never =
            || -> Result<(Option<Proposal>, f64), String> { panic!("a queued trial comes first") };
        assert_eq!(a.take(&mut never).unwrap().map(|t| t.id), Some(7));
        let proposal: Proposal = serde_json::from_value(serde_json::json!({
            "parent": null, "morphisms": [], "description": {"channels": 3, "nodes": []},
            "expected": null, "batch": 8, "kernel": 3
        }))
        .unwrap();
        let worker = std::thread::spawn(move || {
            let mut searches = 0;
            let t = b
                .take(&mut || {
                    searches += 1;
                    Ok((Some(proposal.clone()), 0.5))
                })
                .unwrap();
            (t.map(|t| t.id), searches)
        });
        let mut answered = 0;
        while answered < 2 {
            if let Some(Event::Proposed {
                worker,
                seq,
                proposal,
                search_seconds,
            }) = master.next(Duration::from_millis(5)).unwrap()
            {
                assert_eq!((worker, seq, search_seconds), (1, answered, 0.5));
                assert!(proposal.is_some());
                if answered == 0 {
                    master.ack(1, 0, &Ack::Rejected("taken".into())).unwrap();
                } else {
                    master.assign(&trial(8)).unwrap();
                    master.ack(1, 1, &Ack::Trial(8)).unwrap();
                }
                answered += 1;
            }
        }
        assert_eq!(worker.join().unwrap(), (Some(8), 2));
        // Nothing to claim, nothing answered: the stop ends the wait.
        let c = Link::new(folder.clone(), 2, None);
        master.stop();
        let mut none = || Ok((None, 0.0));
        assert!(c.take(&mut none).unwrap().is_none());
        while master.next(Duration::ZERO).unwrap().is_some() {}
        let done = Event::Done {
            worker: 0,
            trial: 7,
            outcome: Outcome::Failed {
                why: "naïve × 2".into(),
            },
            predicted: None,
            train_seconds: 1.0,
            tuned: None,
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
