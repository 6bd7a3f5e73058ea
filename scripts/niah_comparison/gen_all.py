"""Build the niah template/args exactly as RULER scripts/data/prepare.py does
(model_template_type=base, no --remove_newline_tab, chunk_idx=0 -> seed=42),
then run the unmodified niah.py via run_niah.py (stub tokenizer)."""
import os, sys, subprocess, yaml, json
HERE = os.path.dirname(os.path.abspath(__file__))
SCR = os.path.join(HERE, "src/scripts")
sys.path[:0] = [os.path.join(SCR, "data"), os.path.join(SCR, "data/synthetic")]
from constants import TASKS          # scripts/data/synthetic/constants.py
from template import Templates       # scripts/data/template.py
cfgs = yaml.safe_load(open(os.path.join(SCR, "synthetic.yaml")))
CONFIGS = ["niah_single_1", "niah_multikey_2", "niah_multikey_3"]
LENGTHS = [256, 512, 1024, 2048]
NUM_SAMPLES, SEED = 300, 42
used = {}
status = {}
for name in CONFIGS:
    config = dict(cfgs[name]); config.update(TASKS[config["task"]])
    template = Templates["base"].format(task_template=config["template"]) + config.get("answer_prefix", "")
    for L in LENGTHS:
        save_dir = os.path.join(HERE, "out", str(L))
        cmd = [sys.executable, os.path.join(HERE, "run_niah.py"),
               "--save_dir", save_dir, "--save_name", name, "--subset", "validation",
               "--tokenizer_path", "none", "--tokenizer_type", "whitespace",
               "--max_seq_length", str(L), "--tokens_to_generate", str(config["tokens_to_generate"]),
               "--num_samples", str(NUM_SAMPLES), "--random_seed", str(SEED)]
        for k, v in config["args"].items():
            cmd += [f"--{k}", str(v)]
        cmd += ["--template", template]
        print(" ".join(repr(c) if (" " in c or "\n" in c) else c for c in cmd), flush=True)
        # timeout: niah.py's per-sample retry loop never ends when even `incremental`
        # haystack sentences exceed max_seq_length (happens for noise @256).
        try:
            subprocess.run(cmd, check=True, timeout=300,
                           stderr=open(os.path.join(HERE, "out", f"log_{name}_{L}.txt"), "w"))
            status[f"{name}/{L}"] = "ok"
        except subprocess.TimeoutExpired:
            status[f"{name}/{L}"] = "timeout (niah.py infinite retry loop)"
            print("  -> TIMEOUT", flush=True)
    used[name] = {"template": template, "tokens_to_generate": config["tokens_to_generate"], "args": config["args"]}
json.dump({"runs": status, "configs": used}, open(os.path.join(HERE, "used_args.json"), "w"), indent=1)
