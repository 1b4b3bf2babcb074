//! Mean average precision at IoU 0.5 (PASCAL VOC's all-point interpolation): per class, the
//! detections of every image ranked by score, each matched to the best-overlapping unmatched
//! ground-truth box of its class and image (IoU ≥ the threshold: a true positive; otherwise, or
//! when that box is already matched, a false positive); AP is the area under the precision
//! envelope (precision made monotone from the right) over recall; mAP the mean over the classes
//! that have ground truth.

use super::boxes::{iou, BBox};

/// One detection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Detection {
    pub image: usize,
    pub class: usize,
    pub score: f64,
    pub bbox: BBox,
}

/// One ground-truth box.
#[derive(Clone, Debug, PartialEq)]
pub struct Truth {
    pub image: usize,
    pub class: usize,
    pub bbox: BBox,
}

/// AP of one class.
pub fn average_precision(dets: &[&Detection], truths: &[&Truth], threshold: f64) -> Option<f64> {
    if truths.is_empty() {
        return None;
    }
    let mut order: Vec<&&Detection> = dets.iter().collect();
    order.sort_by(|a, b| b.score.total_cmp(&a.score));
    let mut matched = vec![false; truths.len()];
    let (mut tp, mut fp) = (0.0, 0.0);
    let mut points: Vec<(f64, f64)> = Vec::with_capacity(order.len());
    for d in order {
        let best = truths
            .iter()
            .enumerate()
            .filter(|(_, t)| t.image == d.image)
            .map(|(i, t)| (i, iou(&d.bbox, &t.bbox)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((i, o)) if o >= threshold && !matched[i] => {
                matched[i] = true;
                tp += 1.0;
            }
            _ => fp += 1.0,
        }
        points.push((tp / truths.len() as f64, tp / (tp + fp)));
    }
    // The precision envelope, then the area under it at every change of recall.
    let mut ap = 0.0;
    let mut prev_recall = 0.0;
    for k in 0..points.len() {
        let (r, _) = points[k];
        if r > prev_recall {
            let best = points[k..].iter().map(|p| p.1).fold(0.0, f64::max);
            ap += (r - prev_recall) * best;
            prev_recall = r;
        }
    }
    Some(ap)
}

/// mAP over `classes` and each class's AP (None: no ground truth of that class).
pub fn mean_average_precision(
    dets: &[Detection],
    truths: &[Truth],
    classes: usize,
    threshold: f64,
) -> (Option<f64>, Vec<Option<f64>>) {
    let per: Vec<Option<f64>> = (0..classes)
        .map(|c| {
            let d: Vec<&Detection> = dets.iter().filter(|d| d.class == c).collect();
            let t: Vec<&Truth> = truths.iter().filter(|t| t.class == c).collect();
            average_precision(&d, &t, threshold)
        })
        .collect();
    let have: Vec<f64> = per.iter().flatten().copied().collect();
    let mean = (!have.is_empty()).then(|| have.iter().sum::<f64>() / have.len() as f64);
    (mean, per)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn det(image: usize, class: usize, score: f64, x: f64) -> Detection {
        Detection {
            image,
            class,
            score,
            bbox: [x, 0.0, x + 10.0, 10.0],
        }
    }

    fn truth(image: usize, class: usize, x: f64) -> Truth {
        Truth {
            image,
            class,
            bbox: [x, 0.0, x + 10.0, 10.0],
        }
    }

    /// Two truths; detections TP (0.9), FP (0.8), TP (0.7): precision 1, ½, ⅔ at recall ½, ½, 1.
    /// Envelope: 1 up to recall ½, ⅔ up to 1: AP = ½ · 1 + ½ · ⅔ = ⅚.
    #[test]
    fn ap_by_hand() {
        let t = [truth(0, 0, 0.0), truth(0, 0, 100.0)];
        let d = [
            det(0, 0, 0.9, 0.0),
            det(0, 0, 0.8, 50.0),
            det(0, 0, 0.7, 101.0),
        ];
        let (m, per) = mean_average_precision(&d, &t, 1, 0.5);
        assert!((per[0].unwrap() - 5.0 / 6.0).abs() < 1e-12, "{per:?}");
        assert_eq!(m, per[0]);
    }

    /// A second detection of a matched box is a false positive; a detection in another image
    /// matches nothing there; boxes under the threshold miss.
    #[test]
    fn duplicates_other_images_and_poor_overlap_are_false_positives() {
        let t = [truth(0, 0, 0.0)];
        let d = [
            det(0, 0, 0.9, 0.0),
            det(0, 0, 0.8, 1.0),
            det(1, 0, 0.95, 0.0),
        ];
        // Ranked: image 1 (FP, p 0), TP (recall 1, p ½), duplicate: AP = ½.
        let (m, _) = mean_average_precision(&d, &t, 1, 0.5);
        assert!((m.unwrap() - 0.5).abs() < 1e-12);
        // IoU of [0,10] and [6,16] (same height): 4/16 = 0.25 < 0.5: a miss, AP 0.
        let (m, _) = mean_average_precision(&[det(0, 0, 0.9, 6.0)], &t, 1, 0.5);
        assert_eq!(m, Some(0.0));
        // Nothing detected: AP 0, not undefined.
        assert_eq!(mean_average_precision(&[], &t, 1, 0.5).0, Some(0.0));
    }

    /// mAP averages the classes with ground truth (here two of four): class 0 perfect, class 2
    /// half found: (1 + ½) / 2.
    #[test]
    fn map_over_classes_with_ground_truth() {
        let t = [truth(0, 0, 0.0), truth(0, 2, 0.0), truth(1, 2, 0.0)];
        let d = [
            det(0, 0, 0.9, 0.0),
            det(1, 2, 0.8, 0.0),
            det(0, 1, 0.99, 40.0),
        ];
        let (m, per) = mean_average_precision(&d, &t, 4, 0.5);
        assert_eq!(per[0], Some(1.0));
        assert_eq!(per[1], None, "no truth of class 1: left out");
        assert_eq!(per[2], Some(0.5));
        assert_eq!(per[3], None);
        assert!((m.unwrap() - 0.75).abs() < 1e-12);
    }
}
