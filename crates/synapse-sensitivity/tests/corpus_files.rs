//! The fetched calibration text (`cargo xtask text-corpus`) keeps the held-out part held out:
//! every document its manifest lists is in the part `corpus::part_of` gives it, no document is
//! in both, and the part files are the sizes the manifest records.

use std::collections::BTreeSet;

use synapse_sensitivity::corpus::{Part, part_of};

#[test]
fn the_fetched_corpus_keeps_its_evaluation_part_out_of_calibration() {
    let dir = synapse_testdata::text_corpus_dir();
    if !synapse_testdata::require(&dir.join("manifest.json"), "calibration text corpus") {
        return;
    }
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let names = |part: &str| -> Vec<String> {
        m[part]["documents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let (cal, eval) = (names("calibration"), names("evaluation"));
    assert!(
        cal.len() > 200 && eval.len() > 50,
        "{} / {}",
        cal.len(),
        eval.len()
    );
    assert!(cal.iter().all(|n| part_of(n) == Part::Calibration));
    assert!(eval.iter().all(|n| part_of(n) == Part::Evaluation));
    let c: BTreeSet<&String> = cal.iter().collect();
    assert!(
        eval.iter().all(|n| !c.contains(n)),
        "a document in both parts"
    );
    for (part, file) in [
        ("calibration", "calibration.txt"),
        ("evaluation", "evaluation.txt"),
    ] {
        let len = std::fs::metadata(dir.join(file)).unwrap().len();
        assert_eq!(Some(len), m[part]["bytes"].as_u64(), "{file}");
    }
}
