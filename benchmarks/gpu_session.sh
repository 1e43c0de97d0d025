#!/usr/bin/env bash
# One call on a GPU machine: the standard checks and benchmarks of issues 5 and 9, each step under its
# own time limit, so one slow step cannot eat the call; everything lands in $OUT (one log, the JSON
# files; with the `cache` step also the cache archive in 15 MB parts). At most 8 files come back: the
# archive's parts count (a call that also wrote 4 parts lost its log).
#
#   bash benchmarks/gpu_session.sh STEP...      steps: tests gputests alone reversed tp tprank tpround loadspeed allreduce multigpu exact exactab exactabtp8 pdl cudamla mlasplit mlawide mlaab ncuwide mergefusion mergecost exactmerge fp32tiles exactchunk exactcap exactdemo exactcuda exactwide exactkernels exacttp8 blockm e2ebf16 structure
#                                               smoke e2e e2esampled (e2e at T=0.7, top-p 0.95: ar, dflash, ddtree 8, auto)
#                                               mlaab (ALT_WIDE=alt/mla_wide.cu: the tree's wide MLA engine timed, then the
#                                               alternative's CUDA MLA tests and timings, the tree's file restored; ALT_OF=
#                                               ddtree_chat/csrc/mla_attention.cu: that file instead, e.g. the merge;
#                                               MLAAB_TESTS=0: the two timings alone, e.g. the tree's file against main's)
#                                               e2epenalty (e2e at T=0 under --repeat-penalty 1.1: ids == ar, speed; plain ar beside)
#                                               programs k26 layer kernels
#                                               moe moemla small tiles fma mlatiles compile firststart ncu cache (tests: a quick
#                                               subset; gputests: every GPU test of the kernels and graphs, ~300 s;
#                                               alone: each GPU test file (test_kernels_gpu as two halves) in a process and home of its own, the
#                                               files side by side (ALONE_FILES: only those), then the TP file alone; reversed: all
#                                               of them, last file first; tp: tensor parallelism on one GPU; tprank: rank 0
#                                               of K2.6 at TP=8, collectives as timed stand-ins; loadspeed: a TP=8 rank's load vs the disk; allreduce: one-shot vs NCCL by size (several GPUs); multigpu: TP with each rank on its own GPU
#                                               (tests/test_multigpu.py; its tests skip below the GPUs they need, and `alone` leaves the file out); smoke: the one-shot CLI in every mode, fresh
#                                               homes, text compared; ncu: Nsight Compute counters of the MoE and
#                                               MLA kernels, ncu.csv)
#
# A first start compiles the Triton kernels (BENCHMARKS.md, "First start: compile time"). The script restores
# Triton's and the CUDA library's caches from .tc/cache.tgz.part-* when those exist; the `cache` step
# saves them to $OUT/cache.tgz.part-*: copy those into .tc/ (a folder git ignores: add /.tc/ to
# .git/info/exclude) and carry .tc on the next call. The archive keeps every kernel version restored or
# compiled, so it grows: the carry (working tree ~27 MB + .tc) must stay under 64 MiB, i.e. an archive
# of <= ~35 MB; it holds binaries only (no Triton IR), ~12 MB; when it is larger, carry an older one or
# none (a cold call compiles for ~80 s).
set -u
: "${OUT:?set OUT to the folder that comes back}"
cache_root=${CACHE_ROOT:-/tmp/ddtree-gpu-cache}
export PYTHONPATH=. PYTHONUNBUFFERED=1 DDTREE_CHAT_HOME="$cache_root/home" TRITON_CACHE_DIR="$cache_root/triton"
mkdir -p "$cache_root"
ls .tc/cache.tgz.part-* > /dev/null 2>&1 && cat .tc/cache.tgz.part-* | tar xzf - -C "$cache_root"
log="$OUT/log.txt"
# Triton's intermediate forms: a cached kernel loads from its cubin and metadata alone (Triton's group lookup
# keeps whichever files exist), and leaving these out shrinks the archive ~3x (34 -> 12 MB when it was measured).
ir=(--exclude='*.llir' --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.ptx' --exclude='*.source')

fresh_home() {  # a new user home holding only the CUDA kernel library already built (no measured costs)
    local h
    [ -d "$DDTREE_CHAT_HOME/cache/kernels" ] || python -c "from ddtree_chat.engine.ops.build import library; library()"
    h=$(mktemp -d)
    mkdir -p "$h/cache"
    cp -r "$DDTREE_CHAT_HOME/cache/kernels" "$h/cache/" 2> /dev/null
    echo "$h"
}

# the CUDA MLA tests of both engines (the `mlawide` and `mlaab` steps)
MLA_TESTS=(-m pytest -q -x --durations=10 --timeout 150 tests/test_kernels_gpu.py tests/test_exact_gpu.py
           -k "cuda_mla or mla_attention_rows or mla_attention_replays or mla_rows_of_long")

# the `alone` step's longest file (~250 s of a ~400 s call), run as two processes side by side
ALONE_SPLIT=${ALONE_SPLIT:-tests/test_kernels_gpu.py}

shard_args() {  # FILE or FILE#k/n -> pytest's arguments, one a line: the file, or every n-th of its GPU tests from the k-th
    local f=${1%%#*} k n ids
    [[ $1 == *#* ]] || { echo "$f"; return; }
    k=${1#*#}; n=${k#*/}; k=${k%/*}
    ids=$(python -m pytest --collect-only -q -m gpu "$f" 2> /dev/null | grep "::" | awk -v n="$n" -v k="$k" 'NR % n == k')
    if [ -n "$ids" ]; then echo "$ids"; elif [ "$k" = 0 ]; then echo "$f"; fi  # NOTE: collection failed: shard 0 runs it whole
}

step() {  # name, seconds, command...
    local name=$1 limit=$2 t0 rc
    shift 2
    t0=$(date +%s)
    echo "=== $name (limit ${limit}s): $*" >> "$log"
    timeout "$limit" "$@" >> "$log" 2>&1
    rc=$?
    echo "=== $name rc=$rc in $(( $(date +%s) - t0 ))s" >> "$log"
}

for s in "$@"; do
    case $s in
        tests) step tests 300 python -m pytest -v --durations=15 tests/test_kernels_gpu.py tests/test_graphs.py \
                   -k "glu or mask_and_walk or rope or small_latent or dispatch or engine_on_gpu or cuda or synchronise or topk \
                   or rms_norm or latent" ;;
        gputests) step gputests 420 python -m pytest -q --durations=10 tests/test_kernels_gpu.py tests/test_graphs.py ;;
        alone) units=()  # a file, or FILE#k/n: the k-th of n interleaved shards of its GPU tests
                  # NOTE: ALONE_FILES="tests/a.py ..." narrows it to the files a change touches (the TP file still runs last)
                  for f in ${ALONE_FILES:-$(grep -l "mark.gpu" tests/test_*.py | grep -v -e test_tp_gpu -e test_multigpu)}; do
                      if [[ " $ALONE_SPLIT " == *" $f "* ]]; then units+=("$f#0/2" "$f#1/2"); else units+=("$f"); fi
                  done
                  homes=()
                  for u in "${units[@]}"; do homes+=("$(fresh_home)"); done  # NOTE: the first builds the CUDA library, once
                  for i in "${!units[@]}"; do  # NOTE: a process and home per unit (no test order hides a fault), side by side
                      (log="$OUT/alone-$i.txt"; : > "$log"  # NOTE: in $OUT: a call cut short still returns them
                       mapfile -t args < <(shard_args "${units[$i]}")
                       [ ${#args[@]} -gt 0 ] || exit 0  # NOTE: never a bare pytest (it would run every test)
                       name=$(basename "${units[$i]%%#*}" .py); [[ ${units[$i]} == *#* ]] && name+="-${units[$i]#*#}"
                       DDTREE_CHAT_HOME=${homes[$i]} step "alone-${name/\//of}" 420 \
                           python -m pytest -q -m gpu --timeout 300 "${args[@]}") &
                  done
                  wait  # NOTE: the TP file's ranks spin on one another's flags: it runs alone, after the others
                  for i in "${!units[@]}"; do cat "$OUT/alone-$i.txt" >> "$log" && rm "$OUT/alone-$i.txt"; done
                  # NOTE: a test that hangs (a rank waiting for a collective) fails alone after 300 s, the call goes on
                  DDTREE_CHAT_HOME=$(fresh_home) step alone-test_tp_gpu 420 python -m pytest -q -m gpu --timeout 300 \
                      --durations=5 tests/test_tp_gpu.py ;;
        reversed) reversed=($(grep -l "mark.gpu" tests/test_*.py | tac))  # the whole GPU suite, last file first
                  # NOTE: ~400-560 s on an H200 with a cold Triton cache: give it a call of its own
                  DDTREE_CHAT_HOME=$(fresh_home) step reversed 585 python -m pytest -q -m gpu --timeout 300 "${reversed[@]}" ;;
        tprank) step tprank 300 python benchmarks/k26_forward.py --synthetic-layers 61 --tp-world 8 --context 4096 32768 \
                    --tokens 1 8 17 33 65 --collective-us 0 10 --profile 1 --json "$OUT/tp8_rank0.json" ;;
        tpround) step tpround 300 python benchmarks/k26_round.py --synthetic-layers 61 --tp-world 8 --context 4096 \
                     --budgets 16 --reps 10 --collective-us 0 --json "$OUT/tp8_round.json" ;;  # a rank's round, drafter too (tp_projection --round)
        loadspeed) step loadspeed 400 python benchmarks/load_speed.py --dir /tmp/k26-shards --layers 3 --tp-world 8 \
                       --json "$OUT/load_speed.json" ;;
        allreduce) step allreduce 300 python benchmarks/allreduce.py --json "$OUT/allreduce.json" ;;
        multigpu) step multigpu 420 python -m pytest -q -m gpu --timeout 300 --durations=5 tests/test_multigpu.py ;;
        tp) step tp 420 python -m pytest -q --durations=10 -x tests/test_tp_gpu.py ;;
        exact) step exact 300 python -m pytest -q --durations=10 --timeout 150 tests/test_exact_gpu.py ;;
        exactab) for x in 0 1; do  # the K2.6-shaped forward with and without the row-invariant kernels, one call,
                     # and each one's GPU time by kernel at one token (where the exact path's extra time goes)
                     DDTREE_EXACT=$x step "k26-forward-exact$x" 120 python benchmarks/k26_forward.py --synthetic-layers 4 \
                         --context 8192 --tokens 1 17 65 --profile 1 17 --json "$OUT/k26_forward_exact$x.json"
                 done ;;
        exactabtp8) for r in 1 2; do for x in 0 1; do  # the same at a TP=8 rank's shard (8 heads, the user's box), twice
                     DDTREE_EXACT=$x step "k26-tp8-exact$x-run$r" 150 python benchmarks/k26_forward.py --synthetic-layers 8 \
                         --tp-world 8 --context 8192 32768 --tokens 1 17 65 --json "$OUT/k26_tp8_exact$x-run$r.json"
                 done; done ;;
        cudamla) step cudamla-tests 300 python -m pytest -q -x --durations=10 tests/test_kernels_gpu.py tests/test_exact_gpu.py \
                     -k "cuda_mla or mla_attention_rows or mla_attention_replays"
                 step cudamla 300 python benchmarks/kernels.py --only cuda_mla --json "$OUT/cuda_mla.json" ;;
        exactchunk) step exactchunk 300 python benchmarks/kernels.py --only exact_chunk --json "$OUT/exact_chunk.json" ;;  # chunk lengths at 8 heads
        exactcap) step exactcap 240 python benchmarks/kernels.py --only exact_capacity --json "$OUT/exact_capacity.json" ;;  # attention planned for the whole cache (as the engine's programs) vs for the prefix
        exactdemo) step exactdemo 240 python benchmarks/kernels.py --only exact_demo --json "$OUT/exact_demo.json" ;;  # the same at the demo target's shapes (float32, 4 heads)
        mergefusion) step mergefusion 200 python benchmarks/mla_merge_fusion.py ;;  # the MLA merge's rows vs AR steps, contraction on and off
        mergecost) for f in 0 1 0 1; do  # the merge built without / with FMA contraction, one process each
                       step "mergecost-fusion$f" 120 python -c "import runpy, sys
from ddtree_chat.engine.ops import triton_mla_exact as m
m.MERGE_FP_FUSION = sys.argv[1] == '1'
sys.argv = ['kernels.py', '--only', 'exact_merge']
runpy.run_path('benchmarks/kernels.py', run_name='__main__')" $f
                   done ;;
        exactmerge) step exactmerge 240 python benchmarks/kernels.py --only exact_merge --json "$OUT/exact_merge.json" ;;  # the row-invariant MLA's merge layouts side by side
        mlawide) step mlawide-tests 420 python "${MLA_TESTS[@]}"
                 step mlawide 300 python benchmarks/kernels.py --only cuda_mla --quick --json "$OUT/cuda_mla.json" ;;  # the wide engine beside the narrow one
        mlaab) alt=${ALT_WIDE:-} of=${ALT_OF:-ddtree_chat/csrc/mla_wide.cu}  # the tree's MLA kernels against another
               # version of one file (ALT_WIDE, an untracked file, in place of ALT_OF: by default the wide engine), one machine
               if [ ! -f "$alt" ] || [ ! -f "$of" ]; then echo "=== mlaab: set ALT_WIDE to a file in the working tree (ALT_OF: the file it replaces)" >> "$log"; continue; fi
               step mlaab-base 300 python benchmarks/kernels.py --only cuda_mla --quick --json "$OUT/cuda_mla_base.json"
               cp "$of" "$cache_root/mlaab_base" && cp "$alt" "$of"
               [ "${MLAAB_TESTS:-1}" = 0 ] || step mlaab-tests 420 python "${MLA_TESTS[@]}"  # 0: timings only
               step mlaab-alt 300 python benchmarks/kernels.py --only cuda_mla --quick --json "$OUT/cuda_mla_alt.json"
               cp "$cache_root/mlaab_base" "$of" ;;  # the tree's file back for later steps
        mlasplit) step mlasplit 200 python benchmarks/kernels.py --only cuda_mla --quick --json "$OUT/cuda_mla.json" ;;  # each MLA kernel's time (kernel_us), default plans only
        pdl) DDTREE_PDL=1 step pdl-tests 420 python -m pytest -q -m gpu --timeout 300 tests/test_pdl_gpu.py \
                 tests/test_exact_gpu.py  # every row-invariance and graph test with the kernels launched early
             # the same forwards with DDTREE_PDL off and on, row by row in one process: 4 layers, then a TP=8 rank
             step pdl-forward 200 python benchmarks/k26_forward.py --synthetic-layers 4 --context 8192 --tokens 1 17 65 \
                 --pdl 0 1 0 1 --json "$OUT/k26_forward_pdl.json"
             step pdl-tprank 300 python benchmarks/k26_forward.py --synthetic-layers 61 --tp-world 8 --context 4096 \
                 --tokens 1 17 --pdl 0 1 0 1 --json "$OUT/tp8_rank0_pdl.json" ;;
        exactwide) DDTREE_MLA=cuda-wide step exact-cuda-wide 300 python -m pytest -q --durations=10 --timeout 150 tests/test_exact_gpu.py ;;
        exactcuda) DDTREE_MLA=cuda step exact-cuda-mla 300 python -m pytest -q --durations=10 --timeout 150 tests/test_exact_gpu.py ;;
        exactkernels) step exactkernels 300 python benchmarks/kernels.py --only exact --json "$OUT/exact_kernels.json" ;;
        exacttp8) step exacttp8 300 python benchmarks/kernels.py --only exact_tp8 --json "$OUT/exact_tp8.json" ;;
        blockm) step blockm 200 python benchmarks/kernels.py --only exact_block_m --json "$OUT/blockm.json" ;;
        e2ebf16) step e2ebf16 300 python benchmarks/e2e.py --device cuda --dtype bfloat16 --prompts 12 --max-new 128 \
                     --budgets 16 32 64 --json "$OUT/e2e_bf16.json" ;;
        smoke) step smoke 420 python benchmarks/cli_smoke.py --device cuda --max-new 64 \
                   --kernels "$DDTREE_CHAT_HOME/cache/kernels" ;;
        moemla) DDTREE_MOE_SWEEP=1 step moemla 300 python benchmarks/kernels.py --only moe,mla,linear --json "$OUT/moemla.json" ;;
        e2e) step e2e 240 python benchmarks/e2e.py --device cuda --prompts 12 --max-new 128 --budgets 8 16 32 64 128 auto \
                 --idle --json "$OUT/e2e.json" ;;
        e2esampled) step e2esampled 240 python benchmarks/e2e.py --device cuda --temperature 0.7 --top-p 0.95 --prompts 12 \
                        --max-new 128 --budgets 8 auto --json "$OUT/e2e_sampled.json" ;;
        e2epenalty) step e2epenalty 240 python benchmarks/e2e.py --device cuda --repeat-penalty 1.1 --prompts 12 \
                        --max-new 128 --budgets 16 auto --json "$OUT/e2e_penalty.json" ;;
        fp32tiles) step fp32tiles 300 python benchmarks/fp32_tiles.py --json "$OUT/fp32_tiles.json" ;;  # the float32 product's tile at the demo's verify
        programs) step programs 90 python benchmarks/profile_round.py --modes ar dflash ddtree:32 ddtree:64 --programs \
                      --json "$OUT/programs.json" ;;
        k26) step k26 150 python benchmarks/k26_round.py --synthetic-layers 4 --context 4096 --budgets 16 32 64 \
                 --json "$OUT/k26_round.json" ;;
        layer) step layer 150 python benchmarks/k26_forward.py --synthetic-layers 2 --layer 1 --context 8192 \
                   --tokens 1 16 64 --json "$OUT/layer.json" ;;
        ncu) ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
             sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats
                       --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis)
             step ncu 300 "$ncu_bin" --clock-control none --nvtx --nvtx-include "ncu/" "${sections[@]}" --csv \
                 --page details --log-file "$OUT/ncu.csv" python benchmarks/kernels.py --only ncu --json /dev/null
             # NOTE: should the NVTX filter catch nothing, the MoE kernels by name (its warm-up calls included)
             grep -q moe_gemm "$OUT/ncu.csv" 2> /dev/null || step ncu-moe 200 "$ncu_bin" --clock-control none \
                 --kernel-name regex:moe_gemm "${sections[@]}" --csv --page details --log-file "$OUT/ncu.csv" \
                 python benchmarks/kernels.py --only ncu --json /dev/null
             python benchmarks/ncu_table.py "$OUT/ncu.csv" >> "$log" 2>&1 ;;  # the counters BENCHMARKS.md quotes
        ncuwide) ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)  # the wide MLA engine's counters
                 step ncuwide 300 "$ncu_bin" --clock-control none --nvtx --nvtx-include "ncu/" --kernel-name regex:mla_wide \
                     --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
                     --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --csv --page details \
                     --log-file "$OUT/ncu_wide.csv" python benchmarks/kernels.py --only ncuwide --json /dev/null
                 python benchmarks/ncu_table.py "$OUT/ncu_wide.csv" >> "$log" 2>&1
                 # the same launches' stall reasons (cycles per issued instruction) and pipe activity, raw counters
                 step ncuwide-stalls 300 "$ncu_bin" --clock-control none --nvtx --nvtx-include "ncu/" --kernel-name regex:mla_wide \
                     --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active,smsp__inst_executed.sum" \
                     --csv --page raw --log-file "$OUT/ncu_wide_stalls.csv" python benchmarks/kernels.py --only ncuwide --json /dev/null
                 # where the warps wait, instruction by instruction (the first launch: 131k keys x 8 heads x one token):
                 # sampled stall reasons per SASS line; the report comes back too, for the Nsight Compute GUI
                 step ncuwide-source 300 "$ncu_bin" --clock-control none --nvtx --nvtx-include "ncu/" --kernel-name regex:mla_wide \
                     --launch-count 1 --section SourceCounters --section WarpStateStats --import-source yes -f \
                     -o "$OUT/ncu_wide_source" python benchmarks/kernels.py --only ncuwide --json /dev/null
                 step ncuwide-sass 120 "$ncu_bin" --import "$OUT/ncu_wide_source.ncu-rep" --page source --print-source sass \
                     --csv --log-file "$OUT/ncu_wide_sass.csv"
                 python benchmarks/ncu_sass.py "$OUT/ncu_wide_sass.csv" >> "$log" 2>&1 ;;  # the most sampled lines
        moe) step moe 240 python benchmarks/kernels.py --only moe --json "$OUT/moe.json" ;;  # the picked variants, whole and TP=8 slices
        kernels) DDTREE_MOE_SWEEP=1 step kernels 200 python benchmarks/kernels.py --json "$OUT/kernels.json" ;;
        small) step small 150 python benchmarks/kernels.py --only small --json "$OUT/small.json" ;;
        tiles) step tiles 200 python benchmarks/kernels.py --only tiles --json "$OUT/tiles.json" ;;
        fma) step fma 240 python benchmarks/kernels.py --only fma --json "$OUT/fma.json" ;;
        mlatiles) step mlatiles 420 python benchmarks/kernels.py --only mla_tiles --json "$OUT/mlatiles.json" ;;
        compile) step compile 120 python benchmarks/compile_time.py --json "$OUT/compile.json" ;;
        structure) [ -d .old ] || { echo "structure: no .old here (make it and carry it: see below)" >> "$log"; continue; }
                   pair=(--target "$PWD/ddtree_chat/assets/demo/target" --draft "$PWD/ddtree_chat/assets/demo/draft")
                   for r in 1 2; do for t in old new; do  # e2e in the tree before the one-round change and in this one, twice,
                       # same call, pair and prompts (.old, carried: `git archive 319f177^ | tar x -C .old --exclude=assets
                       # --exclude=training && cp -r ddtree_chat/assets .old/ddtree_chat/`); kernels by row count in both
                       # (DDTREE_EXACT=0: the old tree has no row-invariant kernels)
                       (cd "$([ $t = old ] && echo .old || echo .)" && DDTREE_EXACT=0 step "structure-$t-$r" 300 \
                            python benchmarks/e2e.py --device cuda "${pair[@]}" --budgets 16 32 auto --json "$OUT/structure_${t}_$r.json")
                   done; done
                   step structure-new-exact 300 python benchmarks/e2e.py --device cuda "${pair[@]}" --budgets 16 32 auto \
                       --json "$OUT/structure_new_exact.json"  # the default path (row-invariant kernels), same call
                   for t in old new; do  # where a difference comes from: each program's replay time and the host's share
                       (cd "$([ $t = old ] && echo .old || echo .)" && DDTREE_EXACT=0 step "structure-programs-$t" 120 \
                            python benchmarks/profile_round.py --modes ar ddtree:16 --programs --host --json "$OUT/programs_$t.json")
                   done ;;
        firststart) for p in ${FIRSTSTART:-1 0}; do  # a user's first start of the demo pair (empty home: nvcc builds the
                        # CUDA library; empty Triton cache), the parallel compile on / off
                        TRITON_CACHE_DIR=$(mktemp -d) DDTREE_PRECOMPILE=$p DDTREE_CHAT_HOME=$(mktemp -d) \
                            step "firststart-precompile=$p" 400 python -c "import logging, time; t = time.time(); \
logging.basicConfig(level=logging.INFO, format='%(relativeCreated)7.0f ms %(name)s: %(message)s'); \
from ddtree_chat.engine import Engine; from ddtree_chat.engine.default_model import resolve_model_dirs; \
e = Engine.load(*resolve_model_dirs(None, None), device='cuda'); \
print(f'load {time.time() - t:.1f} s, graphs {e.info[\"cuda_graphs\"]}, recording {e.info[\"graph_capture_s\"]} s')"
                    done ;;
        cache) tar czf - "${ir[@]}" -C "$cache_root" . 2>> "$log" | split -b 15m - "$OUT/cache.tgz.part-" ;;
        *) echo "unknown step $s" >> "$log" ;;
    esac
done
grep "^=== .* rc=" "$log" || true  # the summary: each step's exit status and time
