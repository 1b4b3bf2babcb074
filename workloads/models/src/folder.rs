//! An ImageNet-style folder: one subfolder per class, JPEG images inside. Training images get a
//! random-resized crop (scale 8–100%, aspect 3/4–4/3) and a random horizontal flip; evaluation
//! images are resized (shorter side to 256/224 of the output) and centre-cropped; both are
//! normalised with ImageNet's channel mean and standard deviation.

use crate::data::{DataError, Rng};
use crate::tensor::{Float, Tensor};
use image::imageops::FilterType;
use image::RgbImage;
use rayon::prelude::*;
use std::path::{Path, PathBuf};

const MEAN: [f64; 3] = [0.485, 0.456, 0.406];
const STD: [f64; 3] = [0.229, 0.224, 0.225];

/// The images of a folder tree and their labels (classes in name order).
#[derive(Clone, Debug)]
pub struct ImageFolder {
    pub root: PathBuf,
    pub classes: Vec<String>,
    pub samples: Vec<(PathBuf, usize)>,
}

fn is_image(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .map(|e| matches!(e.to_ascii_lowercase().as_str(), "jpg" | "jpeg"))
        .unwrap_or(false)
}

impl ImageFolder {
    pub fn open(root: &Path) -> Result<ImageFolder, DataError> {
        let read = |p: &Path| {
            std::fs::read_dir(p).map_err(|source| DataError::Read {
                path: p.to_path_buf(),
                source,
            })
        };
        let mut classes: Vec<String> = read(root)?
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        classes.sort();
        if classes.is_empty() {
            return Err(DataError::Invalid(format!(
                "{} has no class folders (expected one subfolder of JPEG images per class)",
                root.display()
            )));
        }
        let mut samples = Vec::new();
        for (label, c) in classes.iter().enumerate() {
            let mut files: Vec<PathBuf> = read(&root.join(c))?
                .flatten()
                .map(|e| e.path())
                .filter(|p| is_image(p))
                .collect();
            files.sort();
            samples.extend(files.into_iter().map(|f| (f, label)));
        }
        if samples.is_empty() {
            return Err(DataError::Invalid(format!(
                "{}: the class folders hold no .jpg/.jpeg files",
                root.display()
            )));
        }
        Ok(ImageFolder {
            root: root.to_path_buf(),
            classes,
            samples,
        })
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Image `i` as `r × r × 3` normalised values; `rng` drives the training augmentation.
    pub fn load<T: Float>(
        &self,
        i: usize,
        r: usize,
        train: bool,
        rng: &mut Rng,
        out: &mut [T],
    ) -> Result<usize, DataError> {
        let (path, label) = &self.samples[i % self.samples.len()];
        let img = image::open(path)
            .map_err(|source| DataError::Image {
                path: path.clone(),
                source,
            })?
            .to_rgb8();
        let view = if train {
            random_resized_crop(&img, r, rng)
        } else {
            centre_crop(&img, r)
        };
        let flip = train && rng.unit() < 0.5;
        for y in 0..r {
            for x in 0..r {
                let sx = if flip { r - 1 - x } else { x };
                let p = view.get_pixel(sx as u32, y as u32);
                for c in 0..3 {
                    out[(y * r + x) * 3 + c] =
                        T::from_f64((p[c] as f64 / 255.0 - MEAN[c]) / STD[c]);
                }
            }
        }
        Ok(*label)
    }

    /// A batch decoded in parallel; augmentation seeded by (`seed`, image id) so that it does
    /// not depend on which thread decodes what.
    pub fn batch<T: Float>(
        &self,
        ids: &[u64],
        r: usize,
        train: bool,
        seed: u64,
    ) -> Result<(Tensor<T>, Vec<usize>), DataError> {
        let mut t = Tensor::zeros(ids.len(), r, r, 3);
        let labels: Vec<Result<usize, DataError>> = t
            .data
            .par_chunks_mut(r * r * 3)
            .zip(ids.par_iter())
            .map(|(out, &i)| {
                let mut rng = Rng::new(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                self.load(i as usize, r, train, &mut rng, out)
            })
            .collect();
        let labels = labels.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok((t, labels))
    }
}

fn random_resized_crop(img: &RgbImage, r: usize, rng: &mut Rng) -> RgbImage {
    let (w, h) = (img.width() as f64, img.height() as f64);
    let area = w * h;
    for _ in 0..10 {
        let target = area * rng.uniform(0.08, 1.0);
        let ratio = rng.uniform((3.0f64 / 4.0).ln(), (4.0f64 / 3.0).ln()).exp();
        let cw = (target * ratio).sqrt().round();
        let ch = (target / ratio).sqrt().round();
        if cw >= 1.0 && ch >= 1.0 && cw <= w && ch <= h {
            let x0 = rng.uniform(0.0, w - cw + 1.0).floor().min(w - cw) as u32;
            let y0 = rng.uniform(0.0, h - ch + 1.0).floor().min(h - ch) as u32;
            let crop = image::imageops::crop_imm(img, x0, y0, cw as u32, ch as u32).to_image();
            return image::imageops::resize(&crop, r as u32, r as u32, FilterType::Triangle);
        }
    }
    centre_crop(img, r)
}

fn centre_crop(img: &RgbImage, r: usize) -> RgbImage {
    let short = (r as f64 * 256.0 / 224.0).round() as u32;
    let (w, h) = (img.width(), img.height());
    let (nw, nh) = if w <= h {
        (
            short,
            ((h as f64 * short as f64 / w as f64).round() as u32).max(short),
        )
    } else {
        (
            ((w as f64 * short as f64 / h as f64).round() as u32).max(short),
            short,
        )
    };
    let resized = image::imageops::resize(img, nw, nh, FilterType::Triangle);
    let (x0, y0) = ((nw - r as u32) / 2, (nh - r as u32) / 2);
    image::imageops::crop_imm(&resized, x0, y0, r as u32, r as u32).to_image()
}

/// Writes a small JPEG image folder (tests and examples): `per_class` images of `size`×`size`
/// per class, each class a distinct colour pattern.
pub fn write_test_folder(
    root: &Path,
    classes: usize,
    per_class: usize,
    size: u32,
) -> Result<(), DataError> {
    for c in 0..classes {
        let dir = root.join(format!("class{c:03}"));
        std::fs::create_dir_all(&dir).map_err(|source| DataError::Write {
            path: dir.clone(),
            source,
        })?;
        for i in 0..per_class {
            let img = RgbImage::from_fn(size, size + (i as u32 % 3) * 8, |x, y| {
                let v = ((x as usize * (c + 1) + y as usize * (2 * c + 1) + i * 7) % 256) as u8;
                let colour = [(c * 80 % 256) as u8, v, 255 - v];
                image::Rgb([colour[c % 3], colour[(c + 1) % 3], colour[(c + 2) % 3]])
            });
            let path = dir.join(format!("img{i:04}.jpg"));
            img.save(&path)
                .map_err(|source| DataError::Image { path, source })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A missing folder is an I/O error kept as the cause; an empty one says what it expected.
    #[test]
    fn errors_keep_their_causes() {
        use std::error::Error;
        let e = ImageFolder::open(Path::new("/nonexistent/imagenet")).unwrap_err();
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(|e| e.kind()),
            Some(std::io::ErrorKind::NotFound),
            "{e}"
        );
        let dir =
            std::env::temp_dir().join(format!("roofline-empty-folder-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = ImageFolder::open(&dir).unwrap_err();
        assert!(matches!(e, DataError::Invalid(_)) && e.to_string().contains("no class folders"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn folder_loads_augments_and_normalises() {
        let root = std::env::temp_dir().join(format!("roofline-folder-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        write_test_folder(&root, 3, 4, 48).unwrap();
        std::fs::write(root.join("class000").join("notes.txt"), "not an image").unwrap();
        let f = ImageFolder::open(&root).unwrap();
        assert_eq!(f.classes, ["class000", "class001", "class002"]);
        assert_eq!(f.len(), 12);
        assert_eq!(f.samples[4].1, 1);
        let (train, labels) = f.batch::<f32>(&[0, 5, 11], 32, true, 7).unwrap();
        assert_eq!(labels, [0, 1, 2]);
        assert_eq!((train.n, train.h, train.w, train.c), (3, 32, 32, 3));
        // Normalised: values within the range of (0..1 − mean)/std.
        assert!(train.data.iter().all(|v| (-2.2..=2.7).contains(v)));
        // Deterministic for a seed, different for another; evaluation has no randomness.
        assert_eq!(f.batch::<f32>(&[0, 5, 11], 32, true, 7).unwrap().0, train);
        assert_ne!(f.batch::<f32>(&[0, 5, 11], 32, true, 8).unwrap().0, train);
        let e1 = f.batch::<f32>(&[3], 32, false, 1).unwrap().0;
        let e2 = f.batch::<f32>(&[3], 32, false, 2).unwrap().0;
        assert_eq!(e1, e2);
        assert!(ImageFolder::open(&root.join("class000")).is_err());
        let _ = std::fs::remove_dir_all(&root);
    }
}
