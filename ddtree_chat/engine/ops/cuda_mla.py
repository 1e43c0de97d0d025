"""Launcher for csrc/mla_attention.cu: row-invariant MLA attention over K2.6's latent cache (512 + 64 columns,
bf16), by one of two engines: narrow (16-row groups, mma.sync; every GPU) or wide (csrc/mla_wide.cu: 64-row CTAs
on wgmma; Hopper, DDTREE_MLA=cuda-wide). Their twin is ops.mla_attention_ref; the row invariance (a node's row
equals the AR step's row at the same position, bit for bit) is what tests/test_exact_gpu.py checks for each.

The launch plan (how many CTAs fold a super, how many split the value columns, row groups per CTA, pipeline
depth, nodes per launch) depends on the launch's shape and the GPU only; no arithmetic does (the kernel's
header says why). The engine depends on the knob and the GPU only."""

from __future__ import annotations

import torch

CHUNK, SUPER = 256, 8  # keys per chunk, chunks per super: fixed by position in the kernel
ROWS = 16  # query rows per row group (a CTA holds one or two)
WIDE_ROWS, WIDE_STAGES = 64, 2  # query rows and pipeline stages of a wide CTA (csrc/mla_wide.cu's kWideRows, kWStages)
MAX_NODES = 1024  # round nodes one call may hold (the kernel's ancestor table)
SCRATCH_BYTES = 256 << 20  # float32 partial states one launch may hold; more nodes go in several launches
FORCE: dict = {}  # plan overrides {"F", "FC", "cs", "stages", "rg", "wide"} (benchmarks, tests)

_FACTS: dict[int, tuple[int, bool, int, bool]] = {}
RESERVED = 1024  # shared memory the GPU keeps per resident CTA


def supported(q_lat, q_pe, ckv, kpe, prefix_len=None, tree_mask=None, scale=None) -> bool:
    """K2.6's latent shape in bf16, rows 16-byte aligned (cp.async), at most MAX_NODES round nodes."""
    if q_lat.dim() != 3 or q_pe.dim() != 3 or q_lat.shape[-1] != 512 or q_pe.shape[-1] != 64:
        return False
    if any(x.dtype != torch.bfloat16 for x in (q_lat, q_pe, ckv, kpe)) or not q_lat.is_cuda:
        return False
    if q_lat.shape[0] > MAX_NODES or ckv.shape[-1] != 512 or kpe.shape[-1] != 64 or ckv.dim() != 2 or kpe.dim() != 2:
        return False
    return all(x.stride(-1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0 for x in (ckv, kpe))


def _device_facts(dev: torch.device) -> tuple[int, bool, int, bool]:
    """(SMs, whether a block's shared memory holds four stages of two row groups (plan's deep), two-stage CTAs
    resident per SM: 2 on sm_90, 1 on sm_120, whether the wide engine runs here: Hopper (its wgmma code is built
    for sm_90a only) and a block holds its shared memory). Asked once a GPU: the plan runs every call."""
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    if idx not in _FACTS:
        from .build import library

        lib = library()
        per_sm = lib.ddt_mla_smem_per_sm(idx) // (lib.ddt_mla_smem_bytes(2, 1) + RESERVED)
        optin = lib.ddt_mla_smem_optin(idx)
        wide = torch.cuda.get_device_capability(idx)[0] == 9 and lib.ddt_mla_wide_smem_bytes() <= optin
        deep = lib.ddt_mla_smem_bytes(4, 2) <= optin
        _FACTS[idx] = (torch.cuda.get_device_properties(idx).multi_processor_count, deep, max(1, min(2, per_sm)),
                       wide)  # NOTE: launch bounds ask for two per SM
    return _FACTS[idx]


def plan(t: int, nh: int, bound: int, sms: int, deep: bool, nodes: int | None = None, per_sm: int = 2,
         wide: bool = False) -> dict:
    """The launch for a round of t nodes x nh heads over a prefix of at most `bound` keys, `nodes` of them
    (default all) per launch: F (8: a CTA per full super; 1: a CTA per FC prefix chunks taken in turn, each stored
    alone), cs (CTAs splitting the value columns), rg (row groups of 16 a CTA), stages, shared slots (NSU of supers,
    SH in all), tail slots per row NTL, nodes per launch. Two row groups (one 256-thread CTA an SM, each key tile
    read once for 32 rows, four stages where they fit, whole columns) when a launch has more than 16 rows.
    Rule (`benchmarks/kernels.py --only cuda_mla`): one-group CTAs take two stages (two CTAs per SM); a CTA per
    super from 8 supers of context when the super CTAs alone fill three quarters of a wave (a CTA per chunk
    would then take several waves of short CTAs and store 8x the partial states), and always when the nodes
    come in several launches (the fewest partial states); else a CTA per FC chunks (the merge folds each super's
    chunks in parallel before the row's fold, so many chunk states cost little), FC the one of fewest waves x
    (FC + 1/4): a CTA's own costs (its start, its first tiles' wait) count as a quarter chunk, and its tile
    pipeline runs on across its chunks (each still its own state: FC moves no operation); the value columns split
    as far as the CTAs still fit in one wave. deep (the GPU's shared memory takes four stages) lets two-group CTAs
    and FORCE take four; per_sm: two-stage one-group CTAs resident per SM (a wave is sms x per_sm).
    wide: 64-row CTAs (csrc/mla_wide.cu: one an SM, whole columns, its kWStages = 2 stages), a CTA per super when
    those CTAs make three waves."""
    nodes = nodes or t
    rg = 1 if wide else FORCE.get("rg") or (2 if nodes * nh > ROWS else 1)
    stages = WIDE_STAGES if wide else FORCE.get("stages") or (4 if rg == 2 and deep else 2)
    # CTAs resident at once (shared memory, registers): two-stage one-group CTAs per_sm an SM, the rest one
    wave = sms * (per_sm if stages == 2 and rg == 1 and not wide else 1)
    rows = WIDE_ROWS if wide else ROWS * rg
    rb = -(-nodes * nh // rows)
    ntl = (CHUNK - 1 + t - 1) // CHUNK + 1  # chunks from L's chunk to L + depth
    nsu = max(bound, 0) // (CHUNK * SUPER)
    # the wide engine's super CTAs pay only when they make three waves (a CTA's fixed costs are larger, its chunks
    # fewer)
    many = (nsu + SUPER - 1) * rb >= 3 * wave if wide else nsu >= 8 and 4 * nsu * rb >= 3 * wave
    f = FORCE.get("F") or (SUPER if many or nodes < t else 1)
    tails = nodes * ntl * -(-nh // rows)
    sh = nsu + SUPER - 1 if f == SUPER else max(bound, 0) // CHUNK
    fc = 1
    if f == 1:
        waves = lambda c: -(-(-(-sh // c) * rb + tails) // wave)  # noqa: E731
        fc = FORCE.get("FC") or min((8, 4, 2, 1), key=lambda c: waves(c) * (4 * c + 1))
    units = ((nsu + SUPER - 1) * rb if f == SUPER else -(-sh // fc) * rb) + tails
    cs = 1 if rg == 2 or wide else FORCE.get("cs") or max(c for c in (1, 2, 4) if units * c <= wave or c == 1)
    p = {"F": f, "FC": fc, "cs": cs, "rg": rg, "stages": stages if deep or wide else 2, "NSU": nsu if f == SUPER else 0,
         "SH": sh, "NTL": ntl, "nodes": nodes, "wide": int(wide)}
    if nodes == t > 1 and (sh + ntl) * t * nh * (512 + 2) * 4 > SCRATCH_BYTES:
        per_node = (nsu + SUPER - 1 + ntl) * nh * (512 + 2) * 4
        return plan(t, nh, bound, sms, deep, max(1, min(t - 1, SCRATCH_BYTES // per_node)), per_sm, wide)
    return p


def wide_fits(dev: torch.device) -> bool:
    """The wide engine runs here (the H100's and H200's 227 KB hold its CTA; other GPUs take the narrow one)."""
    return _device_facts(dev)[3]


def device_plan(t: int, nh: int, bound: int, dev: torch.device) -> dict:
    """plan() for this GPU (its SMs, whether four stages fit, how many CTAs share an SM, the engine). The
    engine depends on the knob and the GPU alone (DDTREE_MLA=cuda-wide, or FORCE["wide"], where wide_fits), never
    on the launch's shape: an AR step and a round must compute a row with the same arithmetic."""
    from ... import knobs

    sms, deep, per_sm, fits = _device_facts(dev)
    wide = bool(FORCE.get("wide", knobs.mla_kernel() == "cuda-wide")) and fits
    return plan(t, nh, bound, sms, deep, per_sm=per_sm, wide=wide)


def mla_attention_cuda(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale, max_prefix: int | None = None):
    """ops.mla_attention_ref's contract for supported() shapes: q_lat [T, h, 512], q_pe [T, h, 64], ckv [S, 512],
    kpe [S, 64], prefix_len an int or a device tensor [1] (then max_prefix, or S - T, bounds it), tree_mask
    [T, T] bool (ancestors before descendants) -> [T, h, 512] bf16."""
    from .build import check, library

    lib = library()
    t, nh, _ = q_lat.shape
    dev = q_lat.device
    if torch.is_tensor(prefix_len):
        plen = prefix_len.reshape(1)
        if plen.device != dev or plen.dtype not in (torch.int32, torch.int64):
            plen = plen.to(device=dev, dtype=torch.int32)
        bound = max_prefix if max_prefix is not None else ckv.shape[0] - t
    else:
        plen = torch.full((1,), int(prefix_len), dtype=torch.int32, device=dev)
        bound = int(prefix_len)
    p = device_plan(t, nh, bound, dev)
    # the narrow engine reads Q 4 bytes at a time, the wide one copies it 16 bytes at a time
    align = 8 if p["wide"] else 2
    ql, qp = (x if x.stride(-1) == 1 and x.stride(0) % align == 0 and x.stride(1) % align == 0
              and x.data_ptr() % (2 * align) == 0 else x.contiguous() for x in (q_lat, q_pe))
    mask = tree_mask.to(device=dev)
    mask = (mask.view(torch.uint8) if mask.dtype == torch.bool else mask.to(torch.uint8)).contiguous()
    slots, batch = p["SH"] + p["NTL"], p["nodes"]
    out = torch.empty(t, nh, 512, dtype=torch.bfloat16, device=dev)
    acc = torch.empty(slots * batch * nh * 512, dtype=torch.float32, device=dev)
    ml = torch.empty(2 * slots * batch * nh, dtype=torch.float32, device=dev)
    stream = torch.cuda.current_stream(dev).cuda_stream
    for n0 in range(0, t, batch):  # NOTE: one launch unless the partial states outgrow SCRATCH_BYTES
        rc = lib.ddt_mla_attention(ql[n0].data_ptr(), qp[n0].data_ptr(), ckv.data_ptr(), kpe.data_ptr(),
                                   plen.data_ptr(), int(plen.dtype == torch.int64), mask[n0].data_ptr(), acc.data_ptr(),
                                   ml.data_ptr(), out[n0].data_ptr(), ql.stride(0), ql.stride(1), qp.stride(0),
                                   qp.stride(1), ckv.stride(0), kpe.stride(0), min(batch, t - n0), t, nh, p["F"],
                                   p["NSU"], p["SH"], p["NTL"], p["FC"], p["cs"], p["stages"], p["rg"], p["wide"],
                                   float(scale * 1.4426950408889634), stream)
        check(rc, "ddt_mla_attention")
    return out
