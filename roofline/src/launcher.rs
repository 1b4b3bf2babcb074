//! Who started this process, read from the launcher's environment before any MPI call: Open
//! MPI's `mpirun`, Slurm's `srun`, or another PMI/PMIx launcher; this rank, its local rank, the
//! world's size, the node's name, and the Slurm job it ran in.
//!
//! Under `srun` a node's name is Slurm's (`SLURMD_NODENAME`: what `sinfo`, `scontrol` and
//! `sacct` call it, and what an operator drains), which may differ from the host name (a
//! `NodeHostname`, an interface's name). `mpirun` inside a batch job is still `mpirun`, with
//! the job's Slurm figures (its daemons are started by `srun`, and pass them on).

use serde::{Deserialize, Serialize};

/// The program that started the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LaunchedBy {
    /// Open MPI's `mpirun` / `mpiexec` (`OMPI_COMM_WORLD_*`).
    Mpirun,
    /// Slurm's `srun`, each task started by a `slurmd` (`SLURM_PROCID`, `SLURM_STEP_ID`).
    Srun,
    /// Another PMIx launcher (`PMIX_RANK`: `prterun`, Flux).
    Pmix,
    /// A PMI-1/2 launcher (`PMI_RANK`: MPICH's Hydra, Intel MPI).
    Pmi,
}

impl LaunchedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            LaunchedBy::Mpirun => "mpirun",
            LaunchedBy::Srun => "srun",
            LaunchedBy::Pmix => "a PMIx launcher",
            LaunchedBy::Pmi => "a PMI launcher",
        }
    }
}

/// The Slurm job a run was part of.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmJob {
    /// `SLURM_JOB_ID`, with `.SLURM_STEP_ID` under `srun` (`sacct -j` takes either).
    pub id: String,
    /// `SLURM_JOB_NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `SLURM_JOB_PARTITION`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// The step's node list (`SLURM_STEP_NODELIST`, else the job's), as Slurm writes it (`h[1-4]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodelist: Option<String>,
}

/// How this process was launched (`provenance.cluster.launcher`, minus the per-rank figures).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    pub by: LaunchedBy,
    /// Ranks in the world (more than one: a single process is not a launch).
    pub size: usize,
    #[serde(skip)]
    pub rank: usize,
    #[serde(skip)]
    pub local_rank: usize,
    /// Slurm's name of this node, where Slurm started the process (or its daemon).
    #[serde(skip)]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmJob>,
}

impl Launch {
    /// The launch that `env` describes (a variable's value, or `None`); `None` for a single
    /// process, or a batch script's own shell (it has `SLURM_NTASKS` but no `SLURM_PROCID`).
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Option<Launch> {
        let num = |v: &str| env(v)?.trim().parse::<usize>().ok();
        let text = |v: &str| {
            env(v)
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        // The launcher that set a rank, in the order of precedence: mpirun inside a Slurm job
        // is mpirun (its orted were started by srun, whose variables its ranks inherit).
        // (The step's task count first: srun inside a larger allocation runs fewer tasks.
        // PMIx sets no size for its ranks, which MPI learns from its server: another
        // launcher's stands in.)
        let (by, rank, size, local) = [
            (
                LaunchedBy::Mpirun,
                "OMPI_COMM_WORLD_RANK",
                &["OMPI_COMM_WORLD_SIZE"][..],
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ),
            (
                LaunchedBy::Srun,
                "SLURM_PROCID",
                &["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"][..],
                "SLURM_LOCALID",
            ),
            (
                LaunchedBy::Pmix,
                "PMIX_RANK",
                &["PMIX_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"][..],
                "PMIX_LOCAL_RANK",
            ),
            (
                LaunchedBy::Pmi,
                "PMI_RANK",
                &["PMI_SIZE"][..],
                "MPI_LOCALRANKID",
            ),
        ]
        .into_iter()
        .find_map(|(by, r, sizes, l)| {
            let size = sizes.iter().find_map(|s| num(s))?;
            Some((by, num(r)?, size, num(l)))
        })?;
        if size < 2 || rank >= size {
            return None;
        }
        let slurm = text("SLURM_JOB_ID").map(|job| SlurmJob {
            id: match (by, text("SLURM_STEP_ID")) {
                (LaunchedBy::Srun, Some(step)) => format!("{job}.{step}"),
                _ => job,
            },
            name: text("SLURM_JOB_NAME"),
            partition: text("SLURM_JOB_PARTITION"),
            nodelist: text("SLURM_STEP_NODELIST").or_else(|| text("SLURM_JOB_NODELIST")),
        });
        Some(Launch {
            by,
            size,
            rank,
            local_rank: local
                .or_else(|| num("SLURM_LOCALID"))
                .or_else(|| num("PMIX_LOCAL_RANK"))
                .unwrap_or(0),
            node_name: text("SLURMD_NODENAME"),
            slurm,
        })
    }

    /// The launch this process's environment describes.
    pub fn here() -> Option<Launch> {
        Launch::from_env(&|v| std::env::var(v).ok())
    }

    /// For the table: `srun, Slurm job 12.0 (partition rl, nodes h[1-4])`.
    pub fn describe(&self) -> String {
        let job = self.slurm.as_ref().map_or(String::new(), |j| {
            let mut extra = Vec::new();
            if let Some(p) = &j.partition {
                extra.push(format!("partition {p}"));
            }
            if let Some(n) = &j.nodelist {
                extra.push(format!("nodes {n}"));
            }
            let extra = if extra.is_empty() {
                String::new()
            } else {
                format!(" ({})", extra.join(", "))
            };
            format!(", Slurm job {}{extra}", j.id)
        });
        format!("{}{job}", self.by.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn launch(vars: &[(&str, &str)]) -> Option<Launch> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Launch::from_env(&|v| m.get(v).cloned())
    }

    /// srun: rank, size, local rank and the node's Slurm name from Slurm's variables alone, the
    /// job with its step.
    #[test]
    fn srun_is_read_from_slurms_variables() {
        let l = launch(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURMD_NODENAME", "nid0003"),
            ("SLURM_JOB_ID", "12"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_JOB_PARTITION", "gpu"),
            ("SLURM_STEP_NODELIST", "nid[0001-0004]"),
            ("SLURM_JOB_NODELIST", "nid[0001-0008]"),
            // A PMIx rank srun's plugin also sets: srun still launched it.
            ("PMIX_RANK", "5"),
        ])
        .unwrap();
        assert_eq!(
            (l.by, l.rank, l.size, l.local_rank),
            (LaunchedBy::Srun, 5, 8, 1)
        );
        assert_eq!(l.node_name.as_deref(), Some("nid0003"));
        let j = l.slurm.as_ref().unwrap();
        assert_eq!(j.id, "12.0");
        assert_eq!(j.nodelist.as_deref(), Some("nid[0001-0004]"));
        assert_eq!(
            l.describe(),
            "srun, Slurm job 12.0 (partition gpu, nodes nid[0001-0004])"
        );
    }

    /// mpirun inside a batch job: mpirun's rank and size win over the orted's srun variables,
    /// and the job is the job (no step).
    #[test]
    fn mpirun_inside_a_batch_job_is_mpirun_with_the_job() {
        let l = launch(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_ID", "1"),
            ("SLURM_JOB_ID", "40"),
            ("SLURMD_NODENAME", "h3"),
        ])
        .unwrap();
        assert_eq!((l.by, l.rank, l.size), (LaunchedBy::Mpirun, 2, 4));
        assert_eq!(l.slurm.unwrap().id, "40");
    }

    /// No launch: nothing set; one rank; a batch script's shell (SLURM_NTASKS, no SLURM_PROCID);
    /// a rank beyond the size; a PMIx rank without a size. PMIx takes its size from another
    /// launcher's variable; srun its step's task count, not the job's.
    #[test]
    fn what_is_not_a_launch() {
        assert!(launch(&[]).is_none());
        assert!(launch(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")]).is_none());
        assert!(launch(&[("SLURM_NTASKS", "4"), ("SLURM_JOB_ID", "9")]).is_none());
        assert!(launch(&[("SLURM_PROCID", "4"), ("SLURM_NTASKS", "4")]).is_none());
        assert!(launch(&[("PMIX_RANK", "1")]).is_none());
        let p = launch(&[("PMIX_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")]).unwrap();
        assert_eq!((p.by, p.rank, p.size), (LaunchedBy::Pmix, 1, 2));
        let s = launch(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_STEP_NUM_TASKS", "2"),
        ])
        .unwrap();
        assert_eq!((s.by, s.size, s.local_rank), (LaunchedBy::Srun, 2, 0));
    }
}
