//! The README stays a front page and every link in it and in `docs/` resolves to a file of
//! the repository.

use std::path::{Path, PathBuf};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The relative link targets (`](target)` or `](target#anchor)`) in a markdown text.
fn links(text: &str) -> Vec<String> {
    text.match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &text[i + 2..];
            let end = rest.find(')')?;
            let target = rest[..end].split('#').next()?.trim();
            (!target.is_empty() && !target.contains("://") && !target.contains(' '))
                .then(|| target.to_string())
        })
        .collect()
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![
        repo().join("README.md"),
        repo().join("python/torch_suite/README.md"),
    ];
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages
}

#[test]
fn the_readme_is_a_front_page_of_at_most_200_lines() {
    let text = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let n = text.lines().count();
    assert!(n <= 200, "README.md has {n} lines; details belong in docs/");
    for command in [
        "cargo run --release --bin collbench -- --np 4",
        "scripts/test-all.sh",
    ] {
        let head: String = text.lines().take(12).collect::<Vec<_>>().join("\n");
        assert!(head.contains(command), "the first lines lack `{command}`");
    }
    // The quick inner loop is documented beside it, and the test command exists.
    assert!(text.contains("Plain `cargo test --release --workspace`"));
    assert!(repo().join("scripts/test-all.sh").exists());
}

#[test]
fn every_link_in_the_readme_and_docs_resolves_to_a_file() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for target in links(&text) {
            if !dir.join(&target).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:#?}");
    assert!(links("a [b](docs/x.md#y) and [c](http://z)") == ["docs/x.md"]);
}
