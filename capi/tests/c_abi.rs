//! Builds the C library for this test run's profile and features, then the
//! C and C++ programs under `tests/c/` and `examples/cpp/` against it, and
//! runs them:
//! - `test_abi.c`: every function and error status, linked to the shared library;
//! - `test_batch.c`: the batched calls, the request queries, the enums' widths;
//! - `test_wrapper.cpp`: the C++ wrapper `mla_cache.hpp` and batched decode steps;
//! - `test_hardening.c`: overflowing sizes, bad multimodal ranges, stale handles;
//! - `test_oom.c`: allocation failure under an address-space limit is a status;
//! - `test_threads.cpp`: 8 threads of random operations on one manager;
//! - `examples/cpp/example.cpp`: linked to the static library.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The repository's root (this package is `capi/` in it).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// The directory of `libmla_cache.so` and `libmla_cache.a`, built once per
/// run (`target/<profile>/deps`, next to this test's executable). Cargo does
/// not build a package's `cdylib` and `staticlib` for its integration tests
/// (they cannot link them), and a `cdylib` has one path whatever its
/// features, so the test builds the library itself with its own profile and
/// features rather than trust whichever build wrote that path last.
fn lib_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let deps = exe.parent().unwrap();
        let profile_dir = deps.parent().unwrap();
        let profile = profile_dir.file_name().unwrap().to_str().unwrap();
        let features: Vec<&str> = [
            (cfg!(feature = "cuda"), "cuda"),
            (cfg!(feature = "remote-redis"), "remote-redis"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .args([
                "build",
                "--quiet",
                "-p",
                "mla-cache-capi",
                "--manifest-path",
            ])
            .arg(root().join("Cargo.toml"))
            .arg("--target-dir")
            .arg(profile_dir.parent().unwrap());
        match profile {
            "debug" => {}
            "release" => {
                cargo.arg("--release");
            }
            other => {
                cargo.args(["--profile", other]);
            }
        }
        if !features.is_empty() {
            cargo.args(["--features", &features.join(",")]);
        }
        let status = cargo.status().expect("cargo runs");
        assert!(status.success(), "building the C library failed: {status}");
        for lib in ["libmla_cache.so", "libmla_cache.a"] {
            assert!(
                deps.join(lib).exists(),
                "{lib} not found in {}",
                deps.display()
            );
        }
        deps.to_path_buf()
    })
    .clone()
}

fn out_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c_abi");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The library's SONAME, `libmla_cache.so.MAJOR`.
const SONAME: &str = concat!("libmla_cache.so.", env!("CARGO_PKG_VERSION_MAJOR"));

/// A directory where the programs find the library under its SONAME (a
/// link to this run's `libmla_cache.so`), one per profile.
fn soname_dir() -> PathBuf {
    let lib = lib_dir();
    let profile = lib.parent().and_then(Path::file_name).unwrap();
    let dir = out_dir().join("lib").join(profile);
    std::fs::create_dir_all(&dir).unwrap();
    // Made aside and renamed over: tests running in parallel never see the
    // link missing.
    let tmp = dir.join(format!("{SONAME}.{:?}", std::thread::current().id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(lib.join("libmla_cache.so"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join(SONAME)).unwrap();
    dir
}

fn run(cmd: &mut Command, what: &str) -> String {
    // cargo's LD_LIBRARY_PATH names target/<profile> too, whose uplifted
    // library may come from another build (other features); it would take
    // precedence over the programs' run path.
    let out = cmd
        .env("LD_LIBRARY_PATH", soname_dir())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Compiles `sources` into `name`, linked to the shared library (with an
/// rpath) or to the static library.
fn build(compiler: &str, flags: &[&str], source: &str, name: &str, shared: bool) -> PathBuf {
    let lib = lib_dir();
    let exe = out_dir().join(name);
    let mut cmd = Command::new(compiler);
    cmd.args(flags)
        .args(["-Wall", "-Wextra", "-Werror", "-g", "-O1"])
        .arg("-I")
        .arg(root().join("include"))
        .arg(root().join(source))
        .arg("-o")
        .arg(&exe);
    if shared {
        cmd.arg(format!("-L{}", lib.display()))
            .arg("-lmla_cache")
            .arg(format!("-Wl,-rpath,{}", soname_dir().display()));
    } else {
        cmd.arg(lib.join("libmla_cache.a")).args([
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-ldl",
            "-lc",
        ]);
        if cfg!(feature = "remote-redis") {
            // The remote tier's TLS comes from the system's OpenSSL.
            cmd.args(["-lssl", "-lcrypto"]);
        }
    }
    cmd.arg("-lm");
    run(&mut cmd, &format!("{compiler} {source}"));
    exe
}

#[test]
fn c_program_exercises_every_function_and_status() {
    let mut flags = vec!["-std=c11", "-pedantic"];
    if cfg!(feature = "cuda") {
        flags.push("-DMLA_TEST_CUDA_FEATURE");
    }
    if cfg!(feature = "remote-redis") {
        flags.push("-DMLA_TEST_REMOTE_FEATURE");
    }
    let exe = build("gcc", &flags, "tests/c/test_abi.c", "test_abi", true);
    let out = run(&mut Command::new(&exe), "test_abi");
    let summary = out.lines().last().unwrap_or_default();
    assert!(summary.ends_with(" passed, 0 failed"), "{out}");
}

#[test]
fn c_program_exercises_the_batched_calls() {
    let exe = build(
        "gcc",
        &["-std=c11", "-pedantic"],
        "tests/c/test_batch.c",
        "test_batch",
        true,
    );
    let out = run(&mut Command::new(&exe), "test_batch");
    assert!(out.contains(" passed, 0 failed"), "{out}");
}

#[test]
fn c_program_hits_every_bound_and_stale_handle() {
    let exe = build(
        "gcc",
        &["-std=c11", "-pedantic"],
        "tests/c/test_hardening.c",
        "test_hardening",
        true,
    );
    let out = run(&mut Command::new(&exe), "test_hardening");
    assert!(out.contains(" passed, 0 failed"), "{out}");
}

#[test]
fn cpp_wrapper_runs_batched_decode_steps() {
    let exe = build(
        "g++",
        &["-std=c++17", "-pedantic", "-pthread"],
        "tests/c/test_wrapper.cpp",
        "test_wrapper",
        true,
    );
    let out = run(&mut Command::new(&exe), "test_wrapper");
    assert!(out.contains(" passed, 0 failed"), "{out}");
}

#[test]
fn allocation_failure_is_a_status_not_an_abort() {
    let exe = build(
        "gcc",
        &["-std=c11", "-pedantic"],
        "tests/c/test_oom.c",
        "test_oom",
        true,
    );
    let out = run(&mut Command::new(&exe), "test_oom");
    assert!(out.contains(" passed, 0 failed"), "{out}");
}

/// What `tool args` prints about this run's shared library.
fn inspect(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool)
        .args(args)
        .arg(lib_dir().join("libmla_cache.so"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool}: {e}"));
    assert!(out.status.success(), "{tool} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_c_library_has_its_soname_and_no_python() {
    let dynamic = inspect("readelf", &["-d"]);
    assert!(
        dynamic.contains(&format!("Library soname: [{SONAME}]")),
        "{dynamic}"
    );
    assert!(!dynamic.contains("libpython"), "{dynamic}");
    let symbols = inspect("nm", &["-D", "--defined-only"]);
    assert!(symbols.contains(" mla_version\n"), "{symbols}");
    assert!(!symbols.contains("PyInit_"), "{symbols}");
}

#[test]
fn cpp_threads_share_one_manager() {
    let exe = build(
        "g++",
        &["-std=c++17", "-pthread"],
        "tests/c/test_threads.cpp",
        "test_threads",
        true,
    );
    let out = run(&mut Command::new(&exe), "test_threads");
    assert!(out.contains(" passed, 0 failed"), "{out}");
}

#[test]
fn cpp_example_links_the_static_library() {
    let exe = build(
        "g++",
        &["-std=c++17", "-pedantic"],
        "examples/cpp/example.cpp",
        "example",
        false,
    );
    let out = run(&mut Command::new(&exe), "example");
    assert!(out.contains("gathered 200 tokens, 200 bit-exact"), "{out}");
    assert!(out.contains("MLA_STATUS_UNKNOWN_REQUEST"), "{out}");
}
