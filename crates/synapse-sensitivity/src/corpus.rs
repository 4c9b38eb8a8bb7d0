//! Calibration and evaluation text: documents split, by document, into a calibration part and
//! a held-out evaluation part that calibration and tuning never see.
//!
//! A document's part is a function of its name alone (BLAKE3 of the name; one in
//! [`EVAL_ONE_IN`] goes to evaluation), so the split is deterministic, independent of the other
//! documents and of their order, and a document is never cut across the parts. Each part has
//! a content hash (names and texts, in name order) that provenance records.

/// One in this many documents (by name hash) is held out for evaluation.
pub const EVAL_ONE_IN: u8 = 4;

/// A named document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// A stable name (a path inside the source package).
    pub name: String,
    /// Its text.
    pub text: String,
}

/// Which part a document belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Used to calibrate (importance maps, imatrix).
    Calibration,
    /// Held out: perplexity, KL and agreement are measured here only.
    Evaluation,
}

/// The part of the document named `name`.
pub fn part_of(name: &str) -> Part {
    let h = blake3::hash(name.as_bytes());
    if h.as_bytes()[0].is_multiple_of(EVAL_ONE_IN) {
        Part::Evaluation
    } else {
        Part::Calibration
    }
}

/// The two parts, each in name order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Calibration documents.
    pub calibration: Vec<Document>,
    /// Held-out evaluation documents.
    pub evaluation: Vec<Document>,
}

/// Splits `docs` by [`part_of`]; each part sorted by name (duplicate names keep one).
pub fn split(mut docs: Vec<Document>) -> Split {
    docs.sort_by(|a, b| a.name.cmp(&b.name));
    docs.dedup_by(|a, b| a.name == b.name);
    let (evaluation, calibration) = docs
        .into_iter()
        .partition(|d| part_of(&d.name) == Part::Evaluation);
    Split {
        calibration,
        evaluation,
    }
}

/// Content hash of a part (BLAKE3 over each document's name and text, length-prefixed).
pub fn part_hash(docs: &[Document]) -> String {
    let mut h = blake3::Hasher::new();
    for d in docs {
        for s in [&d.name, &d.text] {
            h.update(&(s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        }
    }
    h.finalize().to_hex().to_string()
}

/// The documents' texts joined by blank lines (the form the tools read).
pub fn joined(docs: &[Document]) -> String {
    let mut s = String::new();
    for d in docs {
        if !s.is_empty() {
            s.push_str("\n\n");
        }
        s.push_str(d.text.trim_end());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs(n: usize) -> Vec<Document> {
        (0..n)
            .map(|i| Document {
                name: format!("library/mod{i}.rst.txt"),
                text: format!("Text of module {i}."),
            })
            .collect()
    }

    #[test]
    fn the_split_is_by_document_deterministic_and_disjoint() {
        let all = docs(400);
        let s = split(all.clone());
        // Every document in exactly one part, whole.
        assert_eq!(s.calibration.len() + s.evaluation.len(), all.len());
        for d in &all {
            let in_c = s.calibration.contains(d);
            let in_e = s.evaluation.contains(d);
            assert!(in_c ^ in_e, "{}", d.name);
            assert_eq!(in_e, part_of(&d.name) == Part::Evaluation);
        }
        // About one in four held out.
        let e = s.evaluation.len();
        assert!((70..=130).contains(&e), "{e} of 400 held out");
        // Order and the other documents do not matter.
        let mut rev = all.clone();
        rev.reverse();
        assert_eq!(split(rev), s);
        let first: Vec<Document> = all.iter().take(200).cloned().collect();
        let half = split(first);
        assert!(half.evaluation.iter().all(|d| s.evaluation.contains(d)));
        assert!(half.calibration.iter().all(|d| s.calibration.contains(d)));
    }

    #[test]
    fn part_hashes_see_every_name_and_text() {
        let s = split(docs(40));
        let h = part_hash(&s.calibration);
        assert_eq!(h, part_hash(&split(docs(40)).calibration));
        let mut c = s.calibration.clone();
        c[0].text.push('!');
        assert_ne!(part_hash(&c), h);
        let mut c = s.calibration.clone();
        c[0].name.push('x');
        assert_ne!(part_hash(&c), h);
        assert_ne!(part_hash(&s.evaluation), h);
        assert!(joined(&s.calibration).contains("\n\nText of module"));
    }
}
