//! The Extreme Weather data (HPC AI500's EWA workload) as published: one HDF5 file per year,
//! `climo_<year>.h5`, with datasets `images` (float32, [N, 16, H, W]: precipitation, surface
//! pressure, sea-level pressure, reference humidity, T200, T500, total water, reference
//! temperature, surface temperature, zonal wind, lowest zonal wind, meridional wind, lowest
//! meridional wind, Z100, Z200, lowest model height) and `boxes` (int32, [N, up to 15, 5]: ymin,
//! xmin, ymax, xmax, class 0–3 = tropical depression, tropical cyclone, extratropical cyclone,
//! atmospheric river; unused rows all −1).
//!
//! Files are opened for streaming and read one image at a time (a year is ~80 GB), with the
//! pure-Rust `hdf5-pure` crate: no system library, and its row-window reads decode only the
//! image asked for. Per-channel normalisation statistics are computed once per file (streamed)
//! and cached beside it. A synthetic generator writes files of the same layout — smooth fields
//! with storm-like structures of the four kinds and their boxes — so that tests write real HDF5
//! files and read them back through the same loader.

use crate::data::{DataError, Rng};
use std::path::{Path, PathBuf};

pub const CHANNELS: usize = 16;
pub const MAX_BOXES: usize = 15;
pub const CLASSES: [&str; 4] = [
    "tropical depression",
    "tropical cyclone",
    "extratropical cyclone",
    "atmospheric river",
];

/// One ground-truth box in pixels of the file's grid.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WeatherBox {
    pub ymin: i32,
    pub xmin: i32,
    pub ymax: i32,
    pub xmax: i32,
    pub class: usize,
}

/// Per-channel mean and standard deviation.
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelStats {
    pub mean: [f64; CHANNELS],
    pub std: [f64; CHANNELS],
}

/// An open year file.
pub struct EwaFile {
    path: PathBuf,
    file: hdf5_pure::File,
    pub images: usize,
    pub height: usize,
    pub width: usize,
}

fn err(path: &Path, what: impl std::fmt::Display) -> DataError {
    DataError::File {
        path: path.to_path_buf(),
        what: what.to_string(),
    }
}

impl EwaFile {
    /// Opens `path` for streaming and checks the layout.
    pub fn open(path: &Path) -> Result<EwaFile, DataError> {
        let file = hdf5_pure::File::open_streaming(path).map_err(|e| err(path, e))?;
        let shape = |name: &str| -> Result<Vec<u64>, DataError> {
            file.dataset(name)
                .and_then(|d| d.shape())
                .map_err(|e| err(path, format!("dataset `{name}`: {e}")))
        };
        let s = shape("images")?;
        if s.len() != 4 || s[1] != CHANNELS as u64 {
            return Err(err(
                path,
                format!("`images` has shape {s:?}; expected [N, 16, height, width]"),
            ));
        }
        let b = shape("boxes")?;
        if b.len() != 3 || b[0] != s[0] || b[2] != 5 {
            return Err(err(
                path,
                format!("`boxes` has shape {b:?}; expected [{}, up to 15, 5]", s[0]),
            ));
        }
        Ok(EwaFile {
            path: path.to_path_buf(),
            file,
            images: s[0] as usize,
            height: s[2] as usize,
            width: s[3] as usize,
        })
    }

    /// Image `i` as [16, H, W] f32, unnormalised.
    pub fn image(&self, i: usize) -> Result<Vec<f32>, DataError> {
        if i >= self.images {
            return Err(err(&self.path, format!("image {i} of {}", self.images)));
        }
        let v = self
            .file
            .dataset("images")
            .and_then(|d| d.read_f32_rows(i as u64, 1))
            .map_err(|e| err(&self.path, format!("image {i}: {e}")))?;
        if v.len() != CHANNELS * self.height * self.width {
            return Err(err(&self.path, format!("image {i}: {} values", v.len())));
        }
        Ok(v)
    }

    /// The boxes of image `i` (unused rows, all −1, left out).
    pub fn boxes(&self, i: usize) -> Result<Vec<WeatherBox>, DataError> {
        let v = self
            .file
            .dataset("boxes")
            .and_then(|d| d.read_i32_rows(i as u64, 1))
            .map_err(|e| err(&self.path, format!("boxes of image {i}: {e}")))?;
        let mut out = Vec::new();
        for r in v.chunks_exact(5) {
            if r.iter().all(|&x| x == -1) {
                continue;
            }
            if !(0..4).contains(&r[4]) || r[0] > r[2] || r[1] > r[3] {
                return Err(err(&self.path, format!("image {i}: bad box row {r:?}")));
            }
            out.push(WeatherBox {
                ymin: r[0],
                xmin: r[1],
                ymax: r[2],
                xmax: r[3],
                class: r[4] as usize,
            });
        }
        Ok(out)
    }

    fn stats_path(&self) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(".stats.json");
        PathBuf::from(p)
    }

    /// Per-channel statistics over every image, from the cache beside the file when it matches
    /// the file's size and modification time, else computed (streamed, one image at a time)
    /// and cached. Returns them and whether they came from the cache.
    pub fn stats(&self) -> Result<(ChannelStats, bool), DataError> {
        let meta = std::fs::metadata(&self.path).map_err(|source| DataError::Read {
            path: self.path.clone(),
            source,
        })?;
        let stamp = format!(
            "{}:{:?}",
            meta.len(),
            meta.modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_nanos())
        );
        let cache = self.stats_path();
        if let Ok(text) = std::fs::read_to_string(&cache) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                // Exact bits (JSON decimals do not round-trip every f64).
                let arr = |k: &str| -> Option<[f64; CHANNELS]> {
                    let a: Vec<f64> = v[k]
                        .as_array()?
                        .iter()
                        .filter_map(|x| x.as_u64().map(f64::from_bits))
                        .collect();
                    a.try_into().ok()
                };
                if v["file"] == stamp {
                    if let (Some(mean), Some(std)) = (arr("mean_bits"), arr("std_bits")) {
                        return Ok((ChannelStats { mean, std }, true));
                    }
                }
            }
        }
        let (mut sum, mut sq) = ([0.0f64; CHANNELS], [0.0f64; CHANNELS]);
        let plane = self.height * self.width;
        for i in 0..self.images {
            let img = self.image(i)?;
            for c in 0..CHANNELS {
                for &x in &img[c * plane..(c + 1) * plane] {
                    sum[c] += x as f64;
                    sq[c] += x as f64 * x as f64;
                }
            }
        }
        let n = (self.images * plane).max(1) as f64;
        let mut s = ChannelStats {
            mean: [0.0; CHANNELS],
            std: [0.0; CHANNELS],
        };
        for c in 0..CHANNELS {
            s.mean[c] = sum[c] / n;
            s.std[c] = (sq[c] / n - s.mean[c] * s.mean[c])
                .max(0.0)
                .sqrt()
                .max(1e-12);
        }
        let bits = |a: &[f64; CHANNELS]| a.iter().map(|x| x.to_bits()).collect::<Vec<u64>>();
        let j = serde_json::json!({
            "file": stamp,
            "channels": CHANNELS,
            "mean": s.mean.to_vec(),
            "std": s.std.to_vec(),
            "mean_bits": bits(&s.mean),
            "std_bits": bits(&s.std),
        });
        // The cache is an optimisation: an unwritable folder only costs a recomputation.
        let _ = roofline_model::write::write_atomic(&cache, j.to_string().as_bytes());
        Ok((s, false))
    }
}

/// Image `img` ([16, h, w]) normalised per channel and area-averaged down to `oh × ow`
/// (each output cell the mean of the input cells it covers; `oh`, `ow` at most h, w).
pub fn prepare(
    img: &[f32],
    h: usize,
    w: usize,
    s: &ChannelStats,
    oh: usize,
    ow: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; CHANNELS * oh * ow];
    for c in 0..CHANNELS {
        let (m, sd) = (s.mean[c], s.std[c]);
        for oy in 0..oh {
            let (y0, y1) = (oy * h / oh, ((oy + 1) * h / oh).max(oy * h / oh + 1));
            for ox in 0..ow {
                let (x0, x1) = (ox * w / ow, ((ox + 1) * w / ow).max(ox * w / ow + 1));
                let mut acc = 0.0f64;
                for y in y0..y1 {
                    for x in x0..x1 {
                        acc += img[(c * h + y) * w + x] as f64;
                    }
                }
                let v = acc / ((y1 - y0) * (x1 - x0)) as f64;
                out[(c * oh + oy) * ow + ox] = ((v - m) / sd) as f32;
            }
        }
    }
    out
}

/// A synthetic year: `n` images of `h × w` with 1–4 storms each. Every channel is a smooth
/// field (a few low-frequency waves with the channel's own scale and offset) plus each storm's
/// signature: tropical depressions and cyclones as round pressure lows with rotating winds (the
/// cyclone stronger and tighter), extratropical cyclones as larger elongated lows, atmospheric
/// rivers as long diagonal bands of water vapour and precipitation. The boxes cover each storm's
/// core.
pub fn write_synthetic(
    path: &Path,
    n: usize,
    h: usize,
    w: usize,
    seed: u64,
) -> Result<(), DataError> {
    let mut rng = Rng::new(seed);
    let plane = h * w;
    let mut images = vec![0.0f32; n * CHANNELS * plane];
    let mut boxes = vec![-1i32; n * MAX_BOXES * 5];
    let (hf, wf) = (h as f64, w as f64);
    for i in 0..n {
        let img = &mut images[i * CHANNELS * plane..(i + 1) * CHANNELS * plane];
        // Background: per channel an offset, a scale and two waves.
        for c in 0..CHANNELS {
            let (off, scale) = (10.0 * c as f64, 1.0 + c as f64 * 0.3);
            let (k1, k2, p) = (
                rng.uniform(0.0, 1.0) * 3.0,
                rng.uniform(0.0, 1.0) * 3.0,
                rng.uniform(0.0, 1.0) * 6.3,
            );
            for y in 0..h {
                for x in 0..w {
                    let (u, v) = (x as f64 / wf, y as f64 / hf);
                    let f = (k1 * 6.3 * u + p).sin() * (k2 * 6.3 * v).cos() + 0.2 * rng.normal();
                    img[c * plane + y * w + x] = (off + scale * f) as f32;
                }
            }
        }
        let storms = 1 + (rng.uniform(0.0, 1.0) * 4.0) as usize;
        for k in 0..storms.min(MAX_BOXES) {
            let class = (rng.uniform(0.0, 1.0) * 4.0) as usize % 4;
            // Half sizes in pixels, relative to the grid.
            let (ry, rx) = match class {
                0 => (0.06 * hf, 0.06 * hf),
                1 => (0.05 * hf, 0.05 * hf),
                2 => (0.10 * hf, 0.16 * hf),
                _ => (0.08 * hf, 0.30 * wf),
            };
            let cy = ry + rng.uniform(0.0, 1.0) * (hf - 2.0 * ry).max(1.0);
            let cx = rx + rng.uniform(0.0, 1.0) * (wf - 2.0 * rx).max(1.0);
            let strength = match class {
                0 => 4.0,
                1 => 9.0,
                2 => 6.0,
                _ => 7.0,
            };
            for y in 0..h {
                for x in 0..w {
                    let (dy, dx) = ((y as f64 - cy) / ry, (x as f64 - cx) / rx);
                    let (e, wind_u, wind_v) = if class == 3 {
                        // A tilted band: distance across it, long along it.
                        let across = dy - 0.3 * dx;
                        let e = (-across * across * 2.0 - dx * dx * 0.5).exp();
                        (e, e, 0.5 * e)
                    } else {
                        let r2 = dy * dy + dx * dx;
                        let e = (-r2 * 2.0).exp();
                        (e, -dy * e, dx * e)
                    };
                    let px = y * w + x;
                    let mut add = |c: usize, v: f64| img[c * plane + px] += (strength * v) as f32;
                    match class {
                        3 => {
                            add(0, 2.0 * e); // precipitation
                            add(3, 1.5 * e); // humidity
                            add(6, 3.0 * e); // total water
                            add(9, wind_u);
                            add(11, wind_v);
                        }
                        _ => {
                            add(0, e * if class == 1 { 2.0 } else { 1.0 });
                            add(1, -2.0 * e); // surface pressure low
                            add(2, -2.5 * e); // sea-level pressure low
                            add(9, 1.5 * wind_u);
                            add(10, wind_u);
                            add(11, 1.5 * wind_v);
                            add(12, wind_v);
                            add(8, if class == 2 { -e } else { e }); // warm or cold core
                        }
                    }
                }
            }
            let r = &mut boxes[(i * MAX_BOXES + k) * 5..][..5];
            r[0] = (cy - ry).max(0.0) as i32;
            r[1] = (cx - rx).max(0.0) as i32;
            r[2] = ((cy + ry).min(hf - 1.0)) as i32;
            r[3] = ((cx + rx).min(wf - 1.0)) as i32;
            r[4] = class as i32;
        }
    }
    let mut fb = hdf5_pure::FileBuilder::new();
    fb.create_dataset("images")
        .with_f32_data(&images)
        .with_shape(&[n as u64, CHANNELS as u64, h as u64, w as u64]);
    fb.create_dataset("boxes")
        .with_i32_data(&boxes)
        .with_shape(&[n as u64, MAX_BOXES as u64, 5]);
    let tmp = roofline_model::write::temp_path(path);
    fb.write(&tmp).map_err(|e| err(path, e))?;
    std::fs::rename(&tmp, path).map_err(|e| err(path, e))
}

/// A box `[x1, y1, x2, y2]` on the batch's grid and its class (0–3).
pub type ScaledBox = ([f64; 4], usize);

/// Images of one or more year files as training batches: each image read by itself, normalised
/// with its file's statistics, averaged down to `height × width` and laid out NHWC; its boxes
/// scaled to the same grid (`[xmin, ymin, xmax + 1, ymax + 1]` of the file's pixels, so that a
/// box covers the pixels it names).
pub struct EwaSet {
    files: Vec<(std::sync::Mutex<EwaFile>, ChannelStats)>,
    /// (file, image) of every image, files in the order given.
    index: Vec<(usize, usize)>,
    pub height: usize,
    pub width: usize,
    pub paths: Vec<PathBuf>,
}

impl EwaSet {
    /// Opens `paths` (statistics computed once and cached beside each file) for batches of
    /// `height × width`, which must not exceed any file's grid.
    pub fn open(paths: &[PathBuf], height: usize, width: usize) -> Result<EwaSet, DataError> {
        if paths.is_empty() {
            return Err(DataError::Invalid("no Extreme Weather files given".into()));
        }
        let mut files = Vec::new();
        let mut index = Vec::new();
        for (k, p) in paths.iter().enumerate() {
            let f = EwaFile::open(p)?;
            if height > f.height || width > f.width || height == 0 || width == 0 {
                return Err(err(
                    p,
                    format!(
                        "images are {}×{}: cannot read them at {height}×{width} (the resolution may only scale them down)",
                        f.height, f.width
                    ),
                ));
            }
            let (stats, _) = f.stats()?;
            index.extend((0..f.images).map(|i| (k, i)));
            files.push((std::sync::Mutex::new(f), stats));
        }
        Ok(EwaSet {
            files,
            index,
            height,
            width,
            paths: paths.to_vec(),
        })
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Image `i` (over all files): NHWC values and its boxes with 0-based classes.
    pub fn item(&self, i: usize) -> Result<(Vec<f32>, Vec<ScaledBox>), DataError> {
        let &(k, j) = self
            .index
            .get(i)
            .ok_or_else(|| DataError::Invalid(format!("image {i} of {}", self.index.len())))?;
        let (file, stats) = &self.files[k];
        let (img, boxes, h, w) = {
            let f = file.lock().map_err(|_| DataError::LoaderPanicked)?;
            (f.image(j)?, f.boxes(j)?, f.height, f.width)
        };
        let (oh, ow) = (self.height, self.width);
        let chw = prepare(&img, h, w, stats, oh, ow);
        let mut hwc = vec![0.0f32; chw.len()];
        for c in 0..CHANNELS {
            for (px, v) in chw[c * oh * ow..(c + 1) * oh * ow].iter().enumerate() {
                hwc[px * CHANNELS + c] = *v;
            }
        }
        let (sy, sx) = (oh as f64 / h as f64, ow as f64 / w as f64);
        let boxes = boxes
            .iter()
            .map(|b| {
                (
                    [
                        b.xmin as f64 * sx,
                        b.ymin as f64 * sy,
                        (b.xmax + 1) as f64 * sx,
                        (b.ymax + 1) as f64 * sy,
                    ],
                    b.class,
                )
            })
            .collect();
        Ok((hwc, boxes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("roofline-ewa-{name}-{}.h5", std::process::id()))
    }

    /// A synthetic year written as HDF5 and read back through the loader: layout, values,
    /// boxes, statistics computed then cached, normalisation and down-scaling.
    #[test]
    fn synthetic_files_round_trip_through_the_loader() {
        let p = tmp("rt");
        let (n, h, w) = (3, 24, 36);
        write_synthetic(&p, n, h, w, 7).unwrap();
        let f = EwaFile::open(&p).unwrap();
        assert_eq!((f.images, f.height, f.width), (n, h, w));
        let img = f.image(1).unwrap();
        assert_eq!(img.len(), CHANNELS * h * w);
        // Channel offsets as written: channel c sits around 10·c.
        let plane = h * w;
        let mean = |c: usize| {
            img[c * plane..(c + 1) * plane]
                .iter()
                .map(|&x| x as f64)
                .sum::<f64>()
                / plane as f64
        };
        assert!((mean(15) - 150.0).abs() < 20.0, "{}", mean(15));
        for i in 0..n {
            let b = f.boxes(i).unwrap();
            assert!((1..=4).contains(&b.len()), "{b:?}");
            for x in &b {
                assert!(x.class < 4 && (x.ymax as usize) < h && (x.xmax as usize) < w);
            }
        }
        let (s, cached) = f.stats().unwrap();
        assert!(!cached);
        let (s2, cached) = f.stats().unwrap();
        assert!(cached, "the second read comes from the cache");
        assert_eq!(s, s2);
        let small = prepare(&img, h, w, &s, 12, 18);
        assert_eq!(small.len(), CHANNELS * 12 * 18);
        // Normalised over the whole file, one image's channel mean is near 0.
        let m0: f64 = small[..12 * 18].iter().map(|&x| x as f64).sum::<f64>() / (12.0 * 18.0);
        assert!(m0.abs() < 1.5, "{m0}");
        assert!(f.image(n).unwrap_err().to_string().contains("image 3 of 3"));
        let _ = std::fs::remove_file(&p);
        let mut sp = p.into_os_string();
        sp.push(".stats.json");
        let _ = std::fs::remove_file(sp);
    }

    #[test]
    fn other_layouts_are_refused_with_the_expected_shape() {
        let p = tmp("bad");
        let mut fb = hdf5_pure::FileBuilder::new();
        fb.create_dataset("images")
            .with_f32_data(&[0.0; 24])
            .with_shape(&[1, 3, 2, 4]);
        fb.create_dataset("boxes")
            .with_i32_data(&[-1; 5])
            .with_shape(&[1, 1, 5]);
        fb.write(&p).unwrap();
        let e = EwaFile::open(&p).err().unwrap();
        assert!(
            matches!(e, DataError::File { .. }) && e.to_string().contains("[N, 16, height, width]"),
            "{e}"
        );
        let _ = std::fs::remove_file(&p);
        assert!(EwaFile::open(Path::new("/nonexistent/climo_1979.h5")).is_err());
    }

    /// A file written by another tool (h5py, netCDF), named by `ROOFLINE_EWA_FILE`, opens and
    /// every image and box row reads (skipped when the variable is unset).
    #[test]
    fn reads_a_file_named_by_the_environment() {
        let Ok(p) = std::env::var("ROOFLINE_EWA_FILE") else {
            return;
        };
        let f = EwaFile::open(Path::new(&p)).unwrap();
        for i in 0..f.images {
            assert_eq!(f.image(i).unwrap().len(), CHANNELS * f.height * f.width);
            let b = f.boxes(i).unwrap();
            let img = f.image(i).unwrap();
            eprintln!(
                "{p}: image {i}: first {} last {}, {} boxes {b:?}",
                img[0],
                img[img.len() - 1],
                b.len()
            );
        }
    }

    #[test]
    fn area_averaging_by_hand() {
        let s = ChannelStats {
            mean: [0.0; CHANNELS],
            std: [1.0; CHANNELS],
        };
        // A 2 × 4 channel 0 averaged to 1 × 2: (1+2+5+6)/4, (3+4+7+8)/4.
        let mut img = vec![0.0f32; CHANNELS * 8];
        img[..8].copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let out = prepare(&img, 2, 4, &s, 1, 2);
        assert_eq!(&out[..2], &[3.5, 5.5]);
    }
}
