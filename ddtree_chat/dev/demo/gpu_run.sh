#!/usr/bin/env bash
# The demo pair's GPU run (docs/demo-training.md), one step per argument, in the order given; the log and
# the packed results land in $OUT. The teacher GGUF travels as parts in .teacher/ (a folder git ignores),
# copied to /tmp/teacher by `part` over back-to-back calls (a warm machine keeps /tmp), joined by `join`.
#
#   bash ddtree_chat/dev/demo/gpu_run.sh part                     # once per part carried
#   bash ddtree_chat/dev/demo/gpu_run.sh part join teacher data pack-data
#   bash ddtree_chat/dev/demo/gpu_run.sh part join data-everyday3 pack-everyday3   # answers everyday3.py's prompts
#   bash ddtree_chat/dev/demo/gpu_run.sh part join propose data-self pack-self       # the teacher's own requests
#   bash ddtree_chat/dev/demo/gpu_run.sh unpack-data target draft pack-pair eval e2e
#
# Steps: part, join (cat + sha256 + the gguf wheel), teacher (its held-out figures), data (teacher answers,
# resumable, $DATA_SECONDS, $BATCH), pack-data ($OUT/distil.tar.xz), data-everyday3 (the same for everyday3.py's
# prompts, into /tmp/everyday3), pack-everyday3 ($OUT/demo-distil-everyday3.tar.xz, a few MB: within the 16 MiB a
# returned file may have), unpack-data ($DATA_TAR, default the data committed in training/, -> /tmp; everyday3's
# when committed; the self-instruct set's and the drafter's new tasks when committed), propose (self_instruct.py:
# the teacher proposes function requests into /tmp/self-proposals; $PROPOSALS kept, default 20000), data-self
# (the teacher answers them into /tmp/self), pack-self ($OUT/demo-distil-self.tar.xz, both folders), target (data stage + target; TARGET_STEPS,
# RENAMES, NAME_WEIGHT, RENAME_POOL, TARGET_ARCH, QAT_FRAC as a sweep target's fields; TARGET_LIMIT s, default 300),
# eval-target (held-out quality of the target alone, plain decoding), draft (DRAFT_ARGS: extra train.py flags, e.g.
# --draft-novel 0.25 for a share of requests of training/demo-novel-tasks.tar.xz's tasks, those new to the target; with
# TARGET_FROM=DIR, e.g. ddtree_chat/assets/demo/target, a drafter for that finished target: its data stage first,
# with RENAMES/NAME_WEIGHT/RENAME_POOL as the target had them, and eval/e2e use DIR), pack-pair
# ($OUT/pair.tgz.part-*), eval (held-out quality with the drafter), e2e (speed; with
# TARGET_FROM=ddtree_chat/assets/demo/target the shipped drafter's too), sweep (several targets side by side on the GPU, $TARGETS =
# "RENAMES:NAME_WEIGHT:STEPS[:ARCH[:POOL[:SETS[:QAT]]]] ...", each with its eval-target; SETS: extra data sets joined
# by "+", everyday (everyday.py's), everyday2 (everyday2.py's), everyday3 (everyday3.py's) and self (the
# self-instruct set); QAT: train.py's --qat-frac, the share of steps trained under fake INT4; targets of the same
# RENAMES:NAME_WEIGHT, POOL and SETS share one data stage, built first in $SWEEP/data-* and copied), EVERYDAY=0 /
# EVERYDAY2=0 / EVERYDAY3=0 / SELF=0 (target and draft without that set; everyday3 and self only where answered or
# unpacked), pick ($PICK: the sweep target the later steps use).
# Target training longer than one call: with RESUME=1, target and sweep pass train.py --resume and a
# --target-deadline TARGET_MARGIN s (default 80) before the step's limit (sweep: 500 s less its shared data stages';
# a checkpoint every CKPT_EVERY steps, 500, too): a run the deadline stops saves target_ckpt.pt in its folder, exports nothing and skips its eval-target (and
# draft); the same command in the next back-to-back call continues it (its data stage cached in that folder); a
# finished sweep target is neither trained nor evaluated again. Sweep folders: $SWEEP (default /tmp/sweep).
#   TARGETS="8:4:1900:hidden=384,inter=1152:mixed:everyday+everyday2+everyday3+self" RESUME=1 \
#       bash ddtree_chat/dev/demo/gpu_run.sh unpack-data sweep    # then `RESUME=1 ... sweep` until no target pauses
set -u
: "${OUT:?set OUT to the folder that comes back}"
T=/tmp/teacher D=/tmp/distil E=/tmp/everyday E2=/tmp/everyday2 E3=/tmp/everyday3 M=/tmp/demo31
S=/tmp/self SP=/tmp/self-proposals NP=/tmp/novel-proposals SW=${SWEEP:-/tmp/sweep}
TGT=${TARGET_FROM:-/tmp/demo31/target}
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 DDTREE_CHAT_HOME=/tmp/demo-home \
    DDTREE_TEACHER_GGUF=$T/SmolLM2-135M-Instruct.Q4_1.gguf
log="$OUT/demo_log.txt"

data_dirs() {  # the distilled data sets the target and draft steps train on: the later sets too unless EVERYDAY=0 / EVERYDAY2=0 / EVERYDAY3=0 / SELF=0
    echo $D
    [ "${EVERYDAY:-1}" = 1 ] && echo $E
    [ "${EVERYDAY2:-1}" = 1 ] && echo $E2
    [ "${EVERYDAY3:-1}" = 1 ] && [ -d $E3 ] && echo $E3  # once answered (data-everyday3) or committed (unpack-data)
    [ "${SELF:-1}" = 1 ] && [ -d $S ] && echo $S  # the same for the self-instruct set (data-self)
}

folder() {  # a sweep target's fields (or its data settings') -> its folder's name under $SWEEP (pick reads it too)
    echo "$1" | tr ':=,+' '-___'
}

sweep_data() {  # a sweep target's fields -> "NAME FLAGS...": its data settings' folder name and train.py data flags
    local r w pool extra
    IFS=: read -r r w _ _ pool extra _ <<< "$1"
    echo "data-$(folder "$r:$w:$pool:$extra")" \
        --distil $D $(for x in ${extra//+/ }; do echo /tmp/$x; done) --renames "$r" --name-weight "$w" \
        ${pool:+--rename-pool "$pool"}
}

data_flags() {  # the data stage's settings, for `target` and for a drafter of a finished target (TARGET_FROM)
    echo --renames "${RENAMES:-3}" --name-weight "${NAME_WEIGHT:-1}" ${RENAME_POOL:+--rename-pool "$RENAME_POOL"}
}

draft_stages() {  # the draft step's stages: after `target` here, or (TARGET_FROM) against a finished target with its data stage
    if [ -n "${TARGET_FROM:-}" ]; then
        echo --target-from "$TARGET_FROM" --stages data,draft $(data_flags)
    else
        echo --stages draft
    fi
}

resume_flags() {  # a step's limit in seconds -> with RESUME=1, train.py's flags to continue its checkpoint and pause in time
    [ "${RESUME:-0}" = 1 ] && echo "--resume --target-deadline $(( $1 - ${TARGET_MARGIN:-80} )) \
        --target-checkpoint-every ${CKPT_EVERY:-500}"
}

paused() {  # a train.py output folder; true while its target waits in a checkpoint (not exported)
    [ -f "$1/target_ckpt.pt" ] && echo "=== $2 skipped: the target in $1 is paused, not exported (its step again, RESUME=1)" >> "$log"
}

step() {  # name, seconds, command...
    local name=$1 limit=$2 t0
    shift 2
    t0=$(date +%s)
    echo "=== $name (limit ${limit}s): $*" >> "$log"
    timeout "$limit" "$@" >> "$log" 2>&1
    echo "=== $name rc=$? in $(( $(date +%s) - t0 ))s" >> "$log"
}

for s in "$@"; do
    case $s in
        part) mkdir -p $T && cp .teacher/gguf.part.* .teacher/*.whl $T/ 2> /dev/null; ls -l $T >> "$log" ;;
        join) cat $T/gguf.part.* > "$DDTREE_TEACHER_GGUF"
              echo "$SHA  $DDTREE_TEACHER_GGUF" | sha256sum -c >> "$log" 2>&1 || { echo "bad teacher file" >> "$log"; exit 1; }
              python3 -m pip install -q --no-index --no-deps --target /tmp/site $T/gguf-*.whl >> "$log" 2>&1 ;;
        teacher) step teacher 200 python3 -m ddtree_chat.dev.demo.teacher --heldout --device cuda --batch 20 ;;
        data) step data $(( ${DATA_SECONDS:-420} + 120 )) python3 -m ddtree_chat.dev.demo.distil_data --out $D \
                  --prompts 12000 --sampled "${SAMPLED:-1}" --device cuda --batch "${BATCH:-1024}" --max-new 384 \
                  --max-seconds "${DATA_SECONDS:-420}" ;;
        pack-data) tar cJf "$OUT/distil.tar.xz" -C /tmp distil ;;
        data-everyday3) step data-everyday3 $(( ${DATA_SECONDS:-420} + 120 )) python3 -m ddtree_chat.dev.demo.distil_data \
                            --out $E3 --everyday3 --sampled "${SAMPLED:-1}" --device cuda --batch "${BATCH:-1024}" \
                            --max-new 384 --max-seconds "${DATA_SECONDS:-420}" ;;
        pack-everyday3) tar cJf "$OUT/demo-distil-everyday3.tar.xz" -C /tmp everyday3 ;;
        propose) step propose $(( ${DATA_SECONDS:-420} + 120 )) python3 -m ddtree_chat.dev.demo.self_instruct --out $SP \
                     --tasks "${PROPOSALS:-20000}" --device cuda --batch "${BATCH:-1024}" --max-seconds "${DATA_SECONDS:-420}" ;;
        data-self) step data-self $(( ${DATA_SECONDS:-420} + 120 )) python3 -m ddtree_chat.dev.demo.distil_data --out $S \
                       --self-instruct $SP --sampled "${SAMPLED:-1}" --device cuda --batch "${BATCH:-1024}" --max-new 384 \
                       --max-seconds "${DATA_SECONDS:-420}" ;;
        pack-self) tar cJf "$OUT/demo-distil-self.tar.xz" -C /tmp self self-proposals ;;
        unpack-data) [ -d $D ] || tar xJf "${DATA_TAR:-training/demo-distil-data.tar.xz}" -C /tmp
                     [ -d $E ] || tar xJf training/demo-distil-everyday.tar.xz -C /tmp
                     [ -d $E2 ] || tar xJf training/demo-distil-everyday2.tar.xz -C /tmp
                     [ -d $E3 ] || [ ! -f training/demo-distil-everyday3.tar.xz ] \
                         || tar xJf training/demo-distil-everyday3.tar.xz -C /tmp
                     [ -d $S ] || [ ! -f training/demo-distil-self.tar.xz ] || tar xJf training/demo-distil-self.tar.xz -C /tmp
                     [ -d $NP ] || [ ! -f training/demo-novel-tasks.tar.xz ] || tar xJf training/demo-novel-tasks.tar.xz -C /tmp ;;
        target) limit=${TARGET_LIMIT:-300}
                step target "$limit" python3 -m ddtree_chat.dev.demo.train --out $M --distil $(data_dirs) --stages data,target \
                    --target-steps "${TARGET_STEPS:-700}" $(data_flags) ${TARGET_ARCH:+--target-arch "$TARGET_ARCH"} \
                    ${QAT_FRAC:+--qat-frac "$QAT_FRAC"} $(resume_flags "$limit") ;;
        draft) paused $M draft || step draft $(( ${DRAFT_DEADLINE:-430} + 90 )) python3 -m ddtree_chat.dev.demo.train --out $M \
                   --distil $(data_dirs) $(draft_stages) --draft-novel-tasks $NP --max-prompt 512 --gen-len 192 --draft-gen-seconds 70 \
                   --draft-seconds "${DRAFT_SECONDS:-320}" --deadline "${DRAFT_DEADLINE:-430}" ${DRAFT_ARGS:-} ;;
        pack-pair) # NOTE: with TARGET_FROM the target is not this run's (a demo31/target left in /tmp is an older one)
                   tar czf - -C /tmp $(cd /tmp && ls -d $([ -z "${TARGET_FROM:-}" ] && echo demo31/target) demo31/draft \
                       demo31/*.json demo31/*.txt 2> /dev/null) | split -b 15M - "$OUT/pair.tgz.part-" ;;
        sweep) t0=$(date +%s)  # NOTE: 4 x 2000 steps side by side outlast the limit
               cfgs=${TARGETS:-8:4:2000::mixed:everyday+everyday2 8:4:2000:hidden=384,inter=1152:mixed:everyday+everyday2}
               data=$(for cfg in $cfgs; do sweep_data "$cfg"; done)
               shared=$(cut -d' ' -f1 <<< "$data" | sort | uniq -d)
               for d in $shared; do  # data settings several targets share: tokenised once, before them, and copied
                   read -r _ flags <<< "$(grep -m1 "^$d " <<< "$data")"
                   step "$d" 300 python3 -m ddtree_chat.dev.demo.train --out "$SW/$d" $flags --stages data &
               done
               wait
               limit=$(( 500 - ($(date +%s) - t0) ))  # the shared data stages' seconds come out of the targets' 500
               for cfg in $cfgs; do
                   IFS=: read -r r w n arch pool extra qat <<< "$cfg"  # side by side on one GPU, each evaluated held out
                   name=$(folder "$cfg")
                   dir="$SW/$name"
                   read -r d flags <<< "$(sweep_data "$cfg")"
                   (log="$OUT/sweep-$name.txt"  # NOTE: one file per target (8 come back): the held-out JSON joins its log
                    step target $limit python3 -m ddtree_chat.dev.demo.train --out "$dir" $flags \
                        $(grep -qx "$d" <<< "$shared" && echo --data-from "$SW/$d") \
                        --stages data,target --target-steps "$n" ${arch:+--target-arch "$arch"} \
                        ${qat:+--qat-frac "$qat"} $(resume_flags $limit)
                    paused "$dir" eval-target && exit 0
                    if [ "${RESUME:-0}" = 1 ] && [ "$dir/heldout_target.json" -nt "$dir/target_train.json" ]; then
                        echo "=== eval-target skipped: $dir was evaluated after its export" >> "$log"; exit 0
                    fi
                    step eval-target 200 python3 -m ddtree_chat.dev.demo.eval_heldout --target "$dir/target" \
                        --device cuda --mode ar --json "$dir/heldout_target.json"  # not heldout.json: e2e reads its prompts
                    cat "$dir/heldout_target.json" >> "$log") &
               done
               wait ;;
        pick) rm -rf $M && cp -r "$SW/$(folder "$PICK")" $M ;;  # that sweep target is the pair's
        eval-target) paused $M eval-target || step eval-target 200 python3 -m ddtree_chat.dev.demo.eval_heldout --target $TGT \
                         --device cuda --mode ar --json "$OUT/heldout_target.json" ;;
        eval) step eval 200 python3 -m ddtree_chat.dev.demo.eval_heldout --target $TGT --draft $M/draft \
                  --device cuda --json "$OUT/heldout_eval.json" ;;
        e2e) python3 -c "import json; h = json.load(open('$M/heldout.json')); \
json.dump(h['requests'] + h['test'], open('$M/heldout_prompts.json', 'w'), indent=1)"
             # NOTE: a new drafter for the shipped target: the shipped drafter too, same requests, same call (the
             # side-by-side figures that decide whether the new one ships)
             for d in $M/draft $([ "$TGT" = ddtree_chat/assets/demo/target ] && echo ddtree_chat/assets/demo/draft); do
                 name=$([ $d = $M/draft ] && echo demo || echo shipped)
                 step e2e-$name 300 python3 benchmarks/e2e.py --target $TGT --draft $d --device cuda \
                     --prompts-json $M/heldout_prompts.json --prompts 20 --json "$OUT/e2e_${name}_cuda.json"
             done ;;
        *) echo "unknown step $s" >> "$log" ;;
    esac
done
