#!/usr/bin/env bash
# Lays out the originals beside ours, outside the repository, for the comparisons of
# results/cpu/mqar_mad_generators.md:
#   bash scripts/generator_comparison/setup.sh <zoology clone> <mad-lab clone>
# /tmp/zoology_cmp: zoology/config.py, zoology/data/utils.py, zoology/data/multiquery_ar.py
#   unchanged (HazyResearch/zoology @ d88d6f5474f36998d82d5c3bd58a190248d0a669), and
#   zoology/utils.py cut to its first 31 lines (import_from_str, set_determinism; the rest
#   imports wandb).
# /tmp/mad_cmp: mad/data/{instances,dataset,__init__}.py, mad/configs.py, mad/paths.py and
#   configs/tasks/*.yml unchanged (athms/mad-lab @ 0f49a452b84ca0d13f8eb9c1ffa649032376fb1b), and
#   mad/registry.py cut to its imports of the instance functions and task_registry (its layer
#   and model registries import the layers' CUDA dependencies).
# The originals run in a separate venv with torch (CPU) and numpy:
#   python3 -m venv /tmp/torchvenv; /tmp/torchvenv/bin/pip install torch numpy pydantic \
#       pandas tqdm pyyaml
set -euo pipefail
ZOOLOGY=${1:?zoology clone}; MAD=${2:?mad-lab clone}
HERE=$(cd "$(dirname "$0")" && pwd)
ZC=d88d6f5474f36998d82d5c3bd58a190248d0a669
MC=0f49a452b84ca0d13f8eb9c1ffa649032376fb1b
Z=/tmp/zoology_cmp; M=/tmp/mad_cmp
mkdir -p $Z/zoology/data $M/mad/data $M/configs/tasks
for f in zoology/config.py zoology/data/utils.py zoology/data/multiquery_ar.py; do
  git -C "$ZOOLOGY" show $ZC:$f > $Z/$f
done
git -C "$ZOOLOGY" show $ZC:zoology/utils.py | sed -n 1,31p > $Z/zoology/utils.py
touch $Z/zoology/__init__.py $Z/zoology/data/__init__.py
cp "$HERE/zoology_side.py" $Z/
for f in mad/data/instances.py mad/data/dataset.py mad/data/__init__.py mad/configs.py mad/paths.py; do
  git -C "$MAD" show $MC:$f > $M/$f
done
for t in compression fuzzy-in-context-recall in-context-recall memorization \
         noisy-in-context-recall selective-copying; do
  git -C "$MAD" show $MC:configs/tasks/$t.yml > $M/configs/tasks/$t.yml
done
git -C "$MAD" show $MC:mad/registry.py | sed -n 1,8p > $M/mad/registry.py
git -C "$MAD" show $MC:mad/registry.py | awk '/^task_registry = \{/,/^\}/' >> $M/mad/registry.py
printf 'layer_registry = {}\nmodel_registry = {}\n' >> $M/mad/registry.py
touch $M/mad/__init__.py
cp "$HERE/mad_side.py" "$HERE/mad_cases.py" $M/
echo "laid out $Z and $M"
