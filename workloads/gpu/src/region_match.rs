//! The second stage's matching on the GPU (`kernels/cuda/detect.cu`'s `region_match`): each
//! image's candidates (its proposals, then its boxes) labelled by `Matcher::HEAD`'s contract
//! (`Matcher::assign` without the best-match pass, IoUs in the host's f64 rounding), for
//! `head::sample_labelled`'s draw on the host. In training the labels come down in the
//! proposals' one copy (`Ctx::rpn_proposals_matched`); `region_labels` runs the kernel alone
//! on proposals from the host, for `--check`.

use super::*;
use roofline_models::detect::boxes::BBox;
use roofline_models::detect::matcher::{Label, Matcher};

/// The labels of each image's second-stage candidates (its proposals, then its boxes).
pub type CandidateLabels = Vec<Vec<Label>>;

/// Checks that `truth` has a list for each of `images` images and that `matcher` is one the
/// device runs (no best-match pass: the second stage's).
pub(super) fn match_fits(
    truth: &[Vec<BBox>],
    matcher: Matcher,
    images: usize,
) -> Result<(), CudaError> {
    if truth.len() != images {
        return Err(CudaError::Check(format!(
            "region matching on the GPU: {} lists of boxes for {images} images",
            truth.len()
        )));
    }
    if matcher.allow_best {
        return Err(CudaError::Check(
            "region matching on the GPU: no best-match pass (the second stage's matcher only)"
                .into(),
        ));
    }
    Ok(())
}

/// The doubles an image's labels take (its proposals, at most `post`, then its boxes); none
/// without matching.
pub(super) fn label_stride(post: usize, matching: Option<(&[Vec<BBox>], Matcher)>) -> usize {
    matching.map_or(0, |(t, _)| post + t.iter().map(Vec::len).max().unwrap_or(0))
}

/// The labels of each image's candidates (`counts[b]` proposals, then `truth[b]`) from
/// `region_match`'s doubles, `stride` an image.
pub(super) fn parse_labels(
    host: &[f64],
    stride: usize,
    counts: &[usize],
    truth: &[Vec<BBox>],
) -> CandidateLabels {
    counts
        .iter()
        .zip(truth)
        .enumerate()
        .map(|(b, (&n, t))| {
            host[b * stride..][..n + t.len()]
                .iter()
                .map(|&v| {
                    if v >= 0.0 {
                        Label::Fg(v as usize)
                    } else if v == -1.0 {
                        Label::Bg
                    } else {
                        Label::Ignore
                    }
                })
                .collect()
        })
        .collect()
}

impl Ctx {
    /// Each image's second-stage candidates (`proposals[b]`, then `truth[b]`) labelled by
    /// `matcher` on the device: `region_match` alone, on proposals from the host (what
    /// `--check` compares with `Matcher::assign`).
    pub fn region_labels(
        &mut self,
        proposals: &[Vec<BBox>],
        truth: &[Vec<BBox>],
        matcher: Matcher,
    ) -> Result<CandidateLabels, CudaError> {
        let images = proposals.len();
        match_fits(truth, matcher, images)?;
        let post = proposals.iter().map(Vec::len).max().unwrap_or(0);
        let row = 1 + 5 * post;
        let mut rows = vec![0.0f64; images * row];
        for (r, p) in rows.chunks_exact_mut(row).zip(proposals) {
            r[0] = p.len() as f64;
            for (o, b) in r[1..].chunks_exact_mut(5).zip(p) {
                o[..4].copy_from_slice(b);
            }
        }
        let stride = label_stride(post, Some((truth, matcher)));
        let rows_b = self.upload_buf(&rows)?;
        let labels = self.alloc(8 * images * stride)?;
        self.match_regions(
            rows_b.ptr,
            (images, row, post),
            (truth, matcher),
            (labels.ptr, stride),
        )?;
        let host: Vec<f64> = self.get(labels.ptr, images * stride)?;
        let counts: Vec<usize> = proposals.iter().map(Vec::len).collect();
        Ok(parse_labels(&host, stride, &counts, truth))
    }

    /// Launches `region_match` over `images` rows of proposals at `rows` (`row` doubles each,
    /// at most `post` boxes) and the boxes `truth`, the labels written at `label`, `stride`
    /// doubles an image.
    pub(super) fn match_regions(
        &mut self,
        rows: u64,
        (images, row, post): (usize, usize, usize),
        (truth, matcher): (&[Vec<BBox>], Matcher),
        (label, stride): (u64, usize),
    ) -> Result<(), CudaError> {
        if images == 0 {
            return Ok(());
        }
        let mut tstart = vec![0i32];
        let mut flat: Vec<f64> = Vec::new();
        for t in truth {
            flat.extend(t.iter().flatten());
            tstart.push((flat.len() / 4) as i32);
        }
        // Never an empty buffer: a kernel's pointer must be valid even where no box is read.
        flat.resize(flat.len().max(4), 0.0);
        let (truth_b, tstart_b) = (self.upload_buf(&flat)?, self.upload_buf(&tstart)?);
        let (row_i, post_i, stride_i) = (row as i32, post as i32, stride as i32);
        let (high, low) = (matcher.high, matcher.low);
        // SAFETY: rows holds images·row doubles (a count, then at most `post` boxes of 5),
        // truth the boxes tstart (images + 1 offsets) points into, label images·stride
        // doubles with stride ≥ post + the most boxes an image (`label_stride`); the
        // parameters in the kernel's order and types; any block size serves.
        unsafe {
            self.launch_grid(
                "region_match",
                (images as u32, 1),
                256,
                &mut [
                    arg(&rows),
                    arg(&row_i),
                    arg(&post_i),
                    arg(&truth_b.ptr),
                    arg(&tstart_b.ptr),
                    arg(&high),
                    arg(&low),
                    arg(&stride_i),
                    arg(&label),
                ],
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `region_match`'s doubles read back per image: its proposals' labels, then its boxes',
    /// `stride` apart, whatever lies past them; and the stride fits the most boxes an image.
    #[test]
    fn region_labels_are_read_per_image() {
        let b = [0.0, 0.0, 1.0, 1.0];
        let truth = vec![vec![b, b], vec![], vec![b]];
        let stride = label_stride(3, Some((&truth, Matcher::HEAD)));
        assert_eq!(stride, 5);
        assert_eq!(label_stride(3, None), 0);
        let mut host = vec![9.0; 3 * stride];
        host[..4].copy_from_slice(&[1.0, -1.0, 0.0, -2.0]);
        host[stride..stride + 3].copy_from_slice(&[-1.0, -1.0, -1.0]);
        host[2 * stride] = 0.0;
        let got = parse_labels(&host, stride, &[2, 3, 0], &truth);
        use Label::*;
        assert_eq!(
            got,
            vec![
                vec![Fg(1), Bg, Fg(0), Ignore],
                vec![Bg, Bg, Bg],
                vec![Fg(0)]
            ]
        );
        assert!(match_fits(&truth, Matcher::RPN, 3).is_err());
        assert!(match_fits(&truth, Matcher::HEAD, 2).is_err());
    }
}
