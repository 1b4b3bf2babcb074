use super::*;

fn touch(p: &Path) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"not a library").unwrap();
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("roofline-libs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn env_with(root: &Path) -> SearchEnv {
    SearchEnv {
        toolkit_parent: root.join("usr-local"),
        ..SearchEnv::default()
    }
}

#[test]
fn cuda12_wheel_layout_is_found_from_a_virtual_environment() {
    let root = tmp("cu12");
    let sp = root.join("venv/lib/python3.11/site-packages/nvidia");
    touch(&sp.join("cuda_nvrtc/lib/libnvrtc.so.12"));
    touch(&sp.join("cublas/lib/libcublas.so.12"));
    touch(&sp.join("cublas/lib/libcublasLt.so.12"));
    touch(&sp.join("cudnn/lib/libcudnn.so.9"));
    touch(&sp.join("nccl/lib/libnccl.so.2"));
    let env = SearchEnv {
        virtual_env: Some(root.join("venv")),
        ..env_with(&root)
    };
    for (lib, file) in [
        (Lib::Nvrtc, "cuda_nvrtc/lib/libnvrtc.so.12"),
        (Lib::Cublas, "cublas/lib/libcublas.so.12"),
        (Lib::CublasLt, "cublas/lib/libcublasLt.so.12"),
        (Lib::Cudnn, "cudnn/lib/libcudnn.so.9"),
        (Lib::Nccl, "nccl/lib/libnccl.so.2"),
    ] {
        assert_eq!(
            candidates_in(lib, &env, None),
            vec![sp.join(file)],
            "{lib:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn cuda13_wheel_layout_is_found_from_roofline_cuda_libs_in_each_form() {
    let root = tmp("cu13");
    let sp = root.join("env/lib/python3.12/site-packages");
    touch(&sp.join("nvidia/cu13/lib/libnvrtc.so.13"));
    touch(&sp.join("nvidia/cu13/lib/libcublas.so.13"));
    touch(&sp.join("nvidia/cu13/lib/libcublasLt.so.13"));
    touch(&sp.join("nvidia/cudnn/lib/libcudnn.so.9"));
    // site-packages/nvidia, site-packages, and the environment's root all work.
    for given in [sp.join("nvidia"), sp.clone(), root.join("env")] {
        let env = SearchEnv {
            roofline_cuda_libs: Some(given.clone().into_os_string()),
            ..env_with(&root)
        };
        assert_eq!(
            candidates_in(Lib::Nvrtc, &env, None),
            vec![sp.join("nvidia/cu13/lib/libnvrtc.so.13")],
            "{given:?}"
        );
        assert_eq!(
            candidates_in(Lib::CublasLt, &env, None),
            vec![sp.join("nvidia/cu13/lib/libcublasLt.so.13")]
        );
        assert_eq!(
            candidates_in(Lib::Cudnn, &env, None),
            vec![sp.join("nvidia/cudnn/lib/libcudnn.so.9")]
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn both_generations_side_by_side_newest_first_unless_the_driver_is_older() {
    let root = tmp("both");
    let nv = root.join("sp/nvidia");
    touch(&nv.join("cu13/lib/libnvrtc.so.13"));
    touch(&nv.join("cuda_nvrtc/lib/libnvrtc.so.12"));
    let env = SearchEnv {
        roofline_cuda_libs: Some(nv.clone().into_os_string()),
        ..env_with(&root)
    };
    assert_eq!(
        candidates_in(Lib::Nvrtc, &env, None),
        vec![
            nv.join("cu13/lib/libnvrtc.so.13"),
            nv.join("cuda_nvrtc/lib/libnvrtc.so.12")
        ]
    );
    // A CUDA 12 driver (R525–R575) cannot run CUDA 13 libraries: they are passed over.
    assert_eq!(
        candidates_in(Lib::Nvrtc, &env, Some(12)),
        vec![nv.join("cuda_nvrtc/lib/libnvrtc.so.12")]
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn toolkits_conda_and_cuda_home_are_searched_newest_toolkit_first() {
    let root = tmp("tk");
    let ul = root.join("usr-local");
    touch(&ul.join("cuda-12.4/lib64/libcublas.so.12"));
    touch(&ul.join("cuda-13.0/lib64/libcublas.so.13"));
    touch(&ul.join(format!("cuda-12.10/{TOOLKIT_TARGET}/libcublas.so.12")));
    touch(&root.join("conda/lib/libcublas.so.12"));
    touch(&root.join("home/lib64/libcublas.so.12"));
    let env = SearchEnv {
        conda_prefix: Some(root.join("conda")),
        cuda_roots: vec![root.join("home")],
        ..env_with(&root)
    };
    assert_eq!(
        candidates_in(Lib::Cublas, &env, None),
        vec![
            root.join("conda/lib/libcublas.so.12"),
            root.join("home/lib64/libcublas.so.12"),
            ul.join("cuda-13.0/lib64/libcublas.so.13"),
            ul.join(format!("cuda-12.10/{TOOLKIT_TARGET}/libcublas.so.12")),
            ul.join("cuda-12.4/lib64/libcublas.so.12"),
        ]
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_virtual_environment_on_the_path_is_searched_without_activation() {
    let root = tmp("pathvenv");
    let venv = root.join("opt/torch/.venv");
    touch(&venv.join("bin/python3"));
    touch(&venv.join("pyvenv.cfg"));
    touch(&venv.join("lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"));
    touch(&root.join("not-a-venv/bin/python3"));
    let path = std::env::join_paths([root.join("not-a-venv/bin"), venv.join("bin")]).unwrap();
    let env = SearchEnv {
        path_venvs: venvs_on_path(&path),
        ..env_with(&root)
    };
    assert_eq!(env.path_venvs, vec![venv.clone()]);
    assert_eq!(
        candidates_in(Lib::Nccl, &env, None),
        vec![venv.join("lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2")]
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// cuDNN 9's dispatcher opens its sub-libraries by bare soname: from a folder on no search
/// path that fails, unless they were loaded first from beside it. Two small libraries built
/// here stand for the dispatcher and one sub-library.
#[test]
fn a_dispatchers_sub_libraries_are_loaded_from_beside_it() {
    let dir = tmp("companions");
    let build = |name: &str, src: &str| {
        let c = dir.join(format!("{name}.c"));
        std::fs::write(&c, src).unwrap();
        // The target's C compiler (cross runs under qemu name theirs, e.g.
        // ROOFLINE_TEST_CC=aarch64-linux-gnu-gcc).
        let cc = std::env::var("ROOFLINE_TEST_CC").unwrap_or_else(|_| "gcc".into());
        std::process::Command::new(cc)
            .args(["-shared", "-fPIC", "-o"])
            .arg(dir.join(name))
            .arg(&c)
            .arg(format!("-Wl,-soname,{name}"))
            .arg("-ldl")
            .status()
            .is_ok_and(|s| s.success())
    };
    let sub = "libcudnn_rooflinetest.so.9";
    let dispatcher = "libcudnn_rooflinetest_dispatch.so.9.0";
    if !build(sub, "int sub_answer(void) { return 42; }")
        || !build(
            dispatcher,
            "#include <dlfcn.h>\n\
             int dispatch(void) {\n\
               void *h = dlopen(\"libcudnn_rooflinetest.so.9\", RTLD_NOW);\n\
               if (!h) return -1;\n\
               int (*f)(void) = (int (*)(void))dlsym(h, \"sub_answer\");\n\
               return f ? f() : -2;\n\
             }\n",
        )
    {
        eprintln!("skipped: no gcc to build the stand-in libraries");
        return;
    }
    let path = dir.join(dispatcher).to_string_lossy().into_owned();
    let c = CString::new(path.clone()).unwrap();
    // SAFETY: a library built above; `dispatch` has the signature declared.
    let call = || unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        assert!(!h.is_null());
        let f = libc::dlsym(h, c"dispatch".as_ptr());
        assert!(!f.is_null());
        let f: unsafe extern "C" fn() -> i32 = std::mem::transmute(f);
        f()
    };
    assert_eq!(call(), -1, "the sub-library was found without help");
    load_companions(Lib::Cudnn, &path);
    assert_eq!(call(), 42);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn generations_are_read_from_file_names() {
    assert_eq!(generation_of(Lib::Nvrtc, "/x/libnvrtc.so.13"), Some(13));
    assert_eq!(generation_of(Lib::Cublas, "libcublas.so.12.4.5"), Some(12));
    assert_eq!(generation_of(Lib::Nvrtc, "libnvrtc.so"), None);
    // cuDNN and NCCL versions are their own, not CUDA's.
    assert_eq!(generation_of(Lib::Cudnn, "libcudnn.so.9"), None);
}

#[test]
fn a_missing_library_names_the_wheels_that_fix_it() {
    let msg = Lib::Nvrtc.fix();
    assert!(msg.contains("nvidia-cuda-nvrtc-cu12") && msg.contains("nvidia-cuda-nvrtc "));
    assert!(Lib::Driver.fix().contains("NVIDIA driver"));
}

#[test]
fn the_linkers_file_for_a_name_is_found_through_its_symbol() {
    // The C library's maths is on every Linux linker path: the file behind a bare name.
    let file = linker_file("libm.so.6", c"cos").expect("libm.so.6 resolves");
    assert!(file.starts_with('/'), "{file}");
    assert!(
        Path::new(&file)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("libm"),
        "{file}"
    );
    assert!(same_file(&file, &file));
    assert_eq!(linker_file("libroofline-not-a-library.so", c"cos"), None);
    assert_eq!(linker_file("libm.so.6", c"roofline_no_such_symbol"), None);
}
