//! Rank agreement between what the map predicts and what an ablation measures.

/// Average ranks (1-based) of `v`, ties sharing the mean of the ranks they span; `None` if a
/// value is NaN.
pub fn ranks(v: &[f64]) -> Option<Vec<f64>> {
    if v.iter().any(|x| x.is_nan()) {
        return None;
    }
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut r = vec![0f64; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i + 1;
        while j < idx.len() && v[idx[j]] == v[idx[i]] {
            j += 1;
        }
        // Ranks i+1 ..= j share their mean.
        let mean = (i + 1 + j) as f64 / 2.0;
        for &k in &idx[i..j] {
            r[k] = mean;
        }
        i = j;
    }
    Some(r)
}

/// Spearman's rank correlation of `a` and `b`: Pearson's correlation of their average ranks
/// (ties handled). `None` for fewer than 2 pairs, unequal lengths, a NaN, or a constant side
/// (no ranking to agree with).
pub fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() != b.len() || a.len() < 2 {
        return None;
    }
    let (ra, rb) = (ranks(a)?, ranks(b)?);
    let n = ra.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let (mut sab, mut saa, mut sbb) = (0f64, 0f64, 0f64);
    for (x, y) in ra.iter().zip(&rb) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    if saa == 0.0 || sbb == 0.0 {
        return None;
    }
    Some(sab / (saa * sbb).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_average_ties() {
        assert_eq!(
            ranks(&[10.0, 20.0, 20.0, 5.0]).unwrap(),
            vec![2.0, 3.5, 3.5, 1.0]
        );
        assert!(ranks(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn spearman_of_known_orders() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(spearman(&a, &[2.0, 4.0, 8.0, 16.0, 32.0]), Some(1.0));
        assert_eq!(spearman(&a, &[5.0, 4.0, 3.0, 2.0, 1.0]), Some(-1.0));
        // The textbook example: d² = (0,1,1,0,...) → ρ = 1 − 6Σd²/(n(n²−1)).
        let r = spearman(&a, &[1.0, 3.0, 2.0, 4.0, 5.0]).unwrap();
        assert!((r - (1.0 - 6.0 * 2.0 / (5.0 * 24.0))).abs() < 1e-12, "{r}");
        // Monotone transforms do not change it.
        let b = [0.3, 0.1, 0.7, 0.2, 0.9];
        let e: Vec<f64> = b.iter().map(|x: &f64| x.exp() * 100.0).collect();
        assert_eq!(spearman(&a, &b), spearman(&a, &e));
        assert!(spearman(&a, &[1.0; 5]).is_none());
        assert!(spearman(&a[..1], &b[..1]).is_none());
        assert!(spearman(&a, &b[..4]).is_none());
    }
}
