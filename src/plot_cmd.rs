//! `roofline plot`: a machine.json's roofline (classic, hierarchical, COI) as SVG or HTML.

use crate::exit::Failure;
use anyhow::anyhow;
use roofline_model::{write::write_atomic, Machine, MemOp, Threads};
use std::path::PathBuf;

// The options of `roofline plot` (its help is the subcommand's, in main.rs).
#[derive(clap::Args)]
pub struct PlotArgs {
    /// The machine.json written by `roofline probe`.
    pub machine: PathBuf,
    /// Where to write the SVG; a name ending in .html writes the interactive page instead
    /// (one self-contained file: the same figure, a tooltip on every roof, point and label,
    /// a switch for every roof and placed workload).
    #[arg(short, long, default_value = "roofline.svg")]
    pub output: PathBuf,
    /// Which ceilings: those of one thread (t1) or of one thread per core (all).
    #[arg(long, value_enum, default_value = "all")]
    pub threads: Threads,
    /// Which memory operation's ceilings form the slanted roofs.
    #[arg(long, value_enum, default_value = "triad")]
    pub op: MemOp,
    /// Whose roofline: `cpu`, or a GPU of the machine.json (`gpu0`, `gpu1`, ...): its FMA,
    /// mma and GEMM roofs, its L2 and HBM roofs, and its measured ERT curve.
    #[arg(long, default_value = "cpu", value_name = "cpu|gpuN")]
    pub device: String,
    /// Which roofline: `classic` (FLOP per byte of memory traffic); `node-coi` (HPC AI500:
    /// FLOP per byte communicated, one node: its compute roofs, intra-node communication
    /// and memory as slanted roofs); `dist-coi` (the aggregate of all nodes against the
    /// inter-node network). The COI models need a probe run under mpirun. `hierarchical`:
    /// every memory level's roof, and each placement once per level at the intensity of the
    /// traffic that level serves (a capacity model of its layers' footprints: an upper
    /// bound, as no hardware counter is read), its points joined. `links`: not a roofline but
    /// the link matrix of a probe run under mpirun over several nodes, as a heat map (each
    /// pair's bandwidth against the median link, slow links outlined, figures in tooltips).
    /// `gpu-links`: the same between the nodes' GPUs, over NCCL send/recv.
    /// `gpus`: the GPU matrix of a machine with GPUs (every ordered pair by the copy engine
    /// and by the SMs, the host to and from each GPU, each against its NVLink or PCIe figure).
    #[arg(long, value_enum, default_value = "classic")]
    pub model: PlotModel,
    /// Workloads to draw on it (placement.json files from `roofline place`; repeat the
    /// option for several): a point each, its top layers, and a tick at the attainable
    /// bound above each. COI models place them at their COI.
    #[arg(long, value_name = "FILE")]
    pub placement: Vec<PathBuf>,
    /// Draw placements run on other hardware than the machine file describes, with a warning,
    /// where plot otherwise refuses them (exit 2): their points belong under other roofs.
    #[arg(long)]
    pub allow_other_machine: bool,
    /// Draw power-capped GPU roofs at their burst figure (before the cap), not the sustained one.
    #[arg(long)]
    pub burst: bool,
}

/// Which roofline `plot` draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlotModel {
    /// FLOP per byte of memory traffic.
    Classic,
    /// The classic roofs of every memory level, each placement at its intensity.
    Hierarchical,
    /// HPC AI500's single-node COI roofline (FLOP per byte communicated).
    NodeCoi,
    /// HPC AI500's distributed COI roofline (all nodes against the network).
    DistCoi,
    /// The link matrix between the nodes, as a heat map.
    Links,
    /// The link matrix between the nodes' GPUs (NCCL), as a heat map.
    GpuLinks,
    /// The GPU-to-GPU and host-to-GPU copies of a node, as a heat map.
    Gpus,
}

impl PlotModel {
    fn name(self) -> &'static str {
        match self {
            PlotModel::Classic => "classic",
            PlotModel::Hierarchical => "hierarchical",
            PlotModel::NodeCoi => "node-coi",
            PlotModel::DistCoi => "dist-coi",
            PlotModel::Links => "links",
            PlotModel::GpuLinks => "gpu-links",
            PlotModel::Gpus => "gpus",
        }
    }
}

pub fn plot(a: &PlotArgs) -> Result<(), Failure> {
    let (machine, output, threads, op, device, model, placements) = (
        a.machine.as_path(),
        a.output.as_path(),
        a.threads,
        a.op,
        a.device.as_str(),
        a.model,
        &a.placement,
    );
    let ext = output
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    if !matches!(ext.as_deref(), Some("svg" | "html")) {
        return Err(Failure::Input(anyhow!(
            "-o {}: plot writes an SVG figure (.svg) or the interactive page (.html); for a bitmap, open the SVG in a browser or convert it (e.g. `rsvg-convert -o roofline.png roofline.svg`)",
            output.display()
        )));
    }
    let m = Machine::read(machine).map_err(|e| Failure::Input(e.into()))?;
    if matches!(model, PlotModel::Links | PlotModel::GpuLinks) {
        return links(&m, machine, output, model == PlotModel::GpuLinks);
    }
    if model == PlotModel::Gpus {
        return gpus(&m, machine, output);
    }
    let placed: Vec<roofline_model::placement::Placement> = placements
        .iter()
        .map(|p| roofline_model::placement::Placement::read(p))
        .collect::<Result<_, _>>()
        .map_err(|e| Failure::Input(e.into()))?;
    for (p, path) in placed.iter().zip(placements) {
        same_machine(&m, machine, p, path, a.allow_other_machine)?;
    }
    let mut points = Vec::new();
    let mut trajectories = Vec::new();
    for p in &placed {
        let these = if model == PlotModel::Hierarchical {
            // One point per memory level, joined: the workload's traffic level by level.
            let pts = roofline_plots::placed::hierarchical_points(p, &m, threads);
            trajectories.push(pts.iter().map(|q| (q.intensity, q.achieved)).collect());
            pts
        } else {
            let x = |pt: &roofline_model::placement::Point| match model {
                PlotModel::NodeCoi => pt.coi.as_ref().and_then(|c| c.intra_node),
                PlotModel::DistCoi => pt.coi.as_ref().and_then(|c| c.inter_node),
                PlotModel::Classic
                | PlotModel::Hierarchical
                | PlotModel::Links
                | PlotModel::GpuLinks
                | PlotModel::Gpus => Some(pt.oi.analytic),
            };
            roofline_plots::placed::points(p, x)
        };
        if these.is_empty() {
            eprintln!(
                "note: {} has no point on the {} roofline ({})",
                p.workload.name,
                model.name(),
                if model == PlotModel::Hierarchical {
                    "it did no work that the levels' model can place".to_string()
                } else {
                    format!("it did not communicate: {} rank", p.workload.ranks)
                }
            );
        }
        points.extend(these);
    }
    let gpus: Vec<String> = m
        .provenance
        .gpus
        .iter()
        .map(|g| format!("gpu{}", g.index))
        .collect();
    if device != "cpu" && !gpus.iter().any(|g| g == device) {
        return Err(Failure::Input(anyhow!(
            "--device {device}: {} has {}; use cpu{}",
            machine.display(),
            if gpus.is_empty() {
                "no GPU".to_string()
            } else {
                format!("GPUs {}", gpus.join(", "))
            },
            if gpus.is_empty() {
                String::new()
            } else {
                format!(" or one of {}", gpus.join(", "))
            }
        )));
    }
    crate::args::check_writable(output, "-o").map_err(Failure::Input)?;
    let opt = roofline_plots::ClassicOptions {
        model: match model {
            // (`links` returned above.)
            PlotModel::Classic
            | PlotModel::Hierarchical
            | PlotModel::Links
            | PlotModel::GpuLinks
            | PlotModel::Gpus => roofline_plots::Model::Classic,
            PlotModel::NodeCoi => roofline_plots::Model::NodeCoi,
            PlotModel::DistCoi => roofline_plots::Model::DistCoi,
        },
        device: device.into(),
        threads,
        op,
        points,
        trajectories,
        burst: a.burst,
        title: (model == PlotModel::Hierarchical).then(|| {
            format!(
                "Hierarchical roofline: {} (a point per memory level, {op} roofs)",
                m.provenance.cpu.model_name
            )
        }),
        ..Default::default()
    };
    let svg = roofline_plots::classic_svg(&m, &opt).map_err(|e| Failure::Input(e.into()))?;
    // `.html`: the interactive page (tooltips, switches) around the same figure.
    let text = if output
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("html"))
    {
        roofline_plots::html::interactive(
            &svg,
            &format!(
                "Roofline of {} ({}), measured {}",
                m.provenance.host, m.provenance.cpu.model_name, m.provenance.time_utc
            ),
        )
    } else {
        svg
    };
    write_atomic(output, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    outln!("wrote {}", output.display());
    Ok(())
}

/// `--model gpus`: the GPU matrix's heat map (SVG, or the page around it for `.html`).
fn gpus(m: &Machine, machine: &std::path::Path, output: &std::path::Path) -> Result<(), Failure> {
    let Some(g) = roofline_model::gpu_matrix::GpuMatrix::of(&m.ceilings) else {
        return Err(Failure::Input(anyhow!(
            "{} has no GPU copies: they are measured by `roofline probe` on a machine with NVIDIA GPUs (the copy section; peer copies need two GPUs)",
            machine.display()
        )));
    };
    crate::args::check_writable(output, "-o").map_err(Failure::Input)?;
    let title = format!(
        "GPU copies of {} ({} GPUs), measured {}",
        m.provenance.host,
        g.gpus.len(),
        m.provenance.time_utc
    );
    write_figure(
        output,
        &roofline_plots::gpus::matrix_svg(&g, &title),
        &title,
    )
}

/// Writes `svg` to `output`, or the interactive page around it for an `.html` name.
fn write_figure(output: &std::path::Path, svg: &str, title: &str) -> Result<(), Failure> {
    let text = if output
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("html"))
    {
        roofline_plots::html::interactive(svg, title)
    } else {
        svg.to_string()
    };
    write_atomic(output, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    outln!("wrote {}", output.display());
    Ok(())
}

/// `--model links` (`gpu-links`): the link matrix's heat map between the nodes (their GPUs),
/// SVG, or the page around it for `.html`.
fn links(
    m: &Machine,
    machine: &std::path::Path,
    output: &std::path::Path,
    gpu: bool,
) -> Result<(), Failure> {
    let f = m.fleet.as_ref();
    let l = if gpu {
        f.and_then(|f| f.gpu_links.as_ref())
    } else {
        f.and_then(|f| f.links.as_ref())
    };
    let Some(l) = l else {
        return Err(Failure::Input(anyhow!(
            "{} has no {}link matrix: it is measured by a probe under mpirun over two nodes or more, with the comm section (e.g. `mpirun -np N --map-by ppr:1:node roofline probe`){}",
            machine.display(),
            if gpu { "GPU " } else { "" },
            if gpu {
                ", on nodes with NVIDIA GPUs and NCCL (one GPU per rank)"
            } else {
                ""
            }
        )));
    };
    crate::args::check_writable(output, "-o").map_err(Failure::Input)?;
    let title = format!(
        "{} between {} nodes, measured {}",
        if gpu { "GPU links (NCCL)" } else { "Links" },
        l.hosts.len(),
        m.provenance.time_utc
    );
    write_figure(
        output,
        &roofline_plots::links::heat_map_svg(l, &title),
        &title,
    )
}

/// Refuses (or with `allow`, warns about) a placement that ran on other hardware than the
/// machine file describes: its point belongs under that machine's roofs.
fn same_machine(
    m: &Machine,
    machine: &std::path::Path,
    p: &roofline_model::placement::Placement,
    path: &std::path::Path,
    allow: bool,
) -> Result<(), Failure> {
    let why = roofline_model::identity::placed_elsewhere(m, p);
    if why.is_empty() {
        return Ok(());
    }
    let line = format!(
        "{} was placed on another machine than {} describes: {}",
        path.display(),
        machine.display(),
        why.join("; ")
    );
    if allow {
        eprintln!("warning: {line}; drawn anyway, as --allow-other-machine asks");
        Ok(())
    } else {
        Err(Failure::Input(anyhow!(
            "{line}. Plot it with the machine.json it was placed against, or pass --allow-other-machine"
        )))
    }
}
