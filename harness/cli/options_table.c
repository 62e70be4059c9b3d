/* seldp-harness's options: one row each, its getopt entry, argument name and help line. */
#define _POSIX_C_SOURCE 200809L

#include "options_impl.h"

const hx_option_doc hx_option_docs[] = {
    {{"world", required_argument, NULL, OPT_WORLD},
     "N",
     "number of ranks (under mpirun: the number of processes, which it defaults to)"},
    {{"ep", required_argument, NULL, OPT_EP},
     "N",
     "expert-parallel group size (divides --world; under mpirun without --world the default "
     "shrinks "
     "to divide the process count)"},
    {{"order", required_argument, NULL, OPT_ORDER},
     "ep-dp|dp-ep|ORDER",
     "ep-dp: EP groups consecutive (DeepSpeed, Megatron-Core); dp-ep: strided (DeepSpeed's "
     "data-before-expert); or a Megatron order, each of tp, cp, ep, dp, pp at most once "
     "(tp-dp-pp: the rest appended with size 1)"},
    {{"framework", required_argument, NULL, OPT_FRAMEWORK},
     "NAME",
     "megatron, megatron-0.9, deepspeed or torchtitan: build the groups as that framework does "
     "(docs/harness.md, Framework presets)"},
    {{"tp", required_argument, NULL, OPT_TP}, "N", "tensor-parallel size"},
    {{"pp", required_argument, NULL, OPT_PP}, "N", "pipeline stages"},
    {{"cp", required_argument, NULL, OPT_CP}, "N", "context-parallel size"},
    {{"etp", required_argument, NULL, OPT_ETP}, "N", "expert tensor-parallel size"},
    {{"print-layout", no_argument, NULL, OPT_PRINT_LAYOUT},
     NULL,
     "print every group of the layout (any sizes), the replica sets the run would reduce over "
     "with their roots, and exit without training; refuses the options it would ignore"},
    {{"json", no_argument, NULL, OPT_JSON},
     NULL,
     "with --print-layout: the layout as JSON (report.json's layout: every group kind, owners, "
     "roots), which --layout-file reads back"},
    {{"compare-groups", required_argument, NULL, OPT_COMPARE_GROUPS},
     "FILE",
     "compare the layout, rank by rank, with the groups a framework's run built (JSON, "
     "docs/harness-interop.md) and exit: 0 equal, 1 naming the first rank and group kind that "
     "differ"},
    {{"from-megatron", required_argument, NULL, OPT_FROM_MEGATRON},
     "ARGS",
     "import a Megatron-LM or Megatron-DeepSpeed command line (one string, launcher included; "
     "@FILE reads it from FILE): its sizes, order, experts, top-k, layers, router losses, "
     "capacity, shared expert, dtype and clipping; one line per key it ignores; explicit "
     "options override it"},
    {{"from-torchtitan", required_argument, NULL, OPT_FROM_TORCHTITAN},
     "FILE",
     "import a torchtitan train config (TOML): [parallelism] degrees, [training] batch sizes, "
     "dtypes and max_norm, [model] flavor; explicit options override it"},
    {{"from-deepspeed", required_argument, NULL, OPT_FROM_DEEPSPEED},
     "FILE",
     "import a DeepSpeed ds_config (JSON): batch sizes, ZeRO stage, fp16/bf16, clipping, AutoTP "
     "and AutoEP sizes (the MoE sizes from the options or --from-megatron); explicit options "
     "override it"},
    {{"layout-file", required_argument, NULL, OPT_LAYOUT_FILE},
     "FILE",
     "JSON layout (groups, expert owners, roots) instead of --ep/--order"},
    {{"roots", required_argument, NULL, OPT_ROOTS},
     "first|last|spread",
     "roots of groups the layout does not give one"},
    {{"dtype", required_argument, NULL, OPT_DTYPE}, "f32|bf16|f16", "parameter storage dtype"},
    {{"quant", required_argument, NULL, OPT_QUANT},
     "none|nf4|awq",
     "expert weights: dense, or a frozen 4-bit base with LoRA adapters"},
    {{"expert-reduce", required_argument, NULL, OPT_EXPERT_REDUCE},
     "sum|mean",
     "sum: grads / global tokens, then sum; mean: reduce weighted by EP-group tokens"},
    {{"fp32-master", no_argument, NULL, OPT_FP32_MASTER},
     NULL,
     "FP32 gradients and master weights (reduce_fp32 / sum_fp32)"},
    {{"policy", required_argument, NULL, OPT_POLICY},
     "error|zero",
     "missing gradients: error, or contribute zero"},
    {{"steps", required_argument, NULL, OPT_STEPS}, "N", "training steps"},
    {{"tokens", required_argument, NULL, OPT_TOKENS}, "N", "mean tokens per rank and step"},
    {{"token-spread", required_argument, NULL, OPT_TOKEN_SPREAD},
     "N",
     "each rank draws tokens +- up to N (default tokens/4; 0: equal counts)"},
    {{"lr", required_argument, NULL, OPT_LR}, "X", "SGD learning rate"},
    {{"optimizer", required_argument, NULL, OPT_OPTIMIZER},
     "sgd|adamw",
     "the update: sgd (w -= lr g) or adamw (torch.optim.AdamW: bias-corrected moments, decoupled "
     "weight decay, FP32 master weights for half parameters); every update is checked against "
     "the FP64 step of the gradient it used (the post-step check)"},
    {{"adam-beta1", required_argument, NULL, OPT_ADAM_BETA1}, "X", "AdamW's beta1, in [0, 1)"},
    {{"adam-beta2", required_argument, NULL, OPT_ADAM_BETA2}, "X", "AdamW's beta2, in [0, 1)"},
    {{"adam-eps", required_argument, NULL, OPT_ADAM_EPS}, "X", "AdamW's epsilon, in (0, 1]"},
    {{"weight-decay", required_argument, NULL, OPT_WEIGHT_DECAY},
     "X",
     "AdamW's decoupled weight decay (w *= 1 - lr wd), in [0, 1] with lr wd < 1"},
    {{"zero", required_argument, NULL, OPT_ZERO},
     "0|1",
     "1: the distributed optimizer: every replica set reduce-scatters its gradients, each rank "
     "updates its range of the FP32 masters and state, and the set all-gathers the parameters "
     "(implies --fp32-master; ranks as threads on the host)"},
    {{"loss-scale", required_argument, NULL, OPT_LOSS_SCALE},
     "dynamic|X",
     "F16 loss scaling: gradients made at S times the loss, unscaled before the update; an "
     "overflow anywhere skips the step on every rank (one found_inf over the world); dynamic: S "
     "from --loss-scale-init, halved on an overflow, doubled after --loss-scale-window clean "
     "steps"},
    {{"loss-scale-init", required_argument, NULL, OPT_LOSS_SCALE_INIT},
     "X",
     "dynamic loss scaling's first S (the harness's half gradients are loss sums, about --tokens "
     "times a mean loss's: 1024 here is a framework's 65536)"},
    {{"loss-scale-window", required_argument, NULL, OPT_LOSS_SCALE_WINDOW},
     "N",
     "dynamic loss scaling: steps without an overflow before S doubles"},
    {{"inject-overflow", required_argument, NULL, OPT_INJECT_OVERFLOW},
     "STEP",
     "with --loss-scale: an inf in one expert gradient of the last rank in step STEP (1-based), "
     "which every rank must skip"},
    {{"clip-grad", required_argument, NULL, OPT_CLIP_GRAD},
     "X",
     "clip the global gradient norm (every replica set and shard once) to X before the update, "
     "and check it against the FP64 reference's (0: off)"},
    {{"overlap", no_argument, NULL, OPT_OVERLAP},
     NULL,
     "overlap the reductions with the backward: each rank starts its sessions' reductions "
     "before its backward, marks each layer's gradients ready as its backward produces them and "
     "finishes after it (bit-identical results; host ranks in one process only)"},
    {{"bucket-bytes", required_argument, NULL, OPT_BUCKET_BYTES},
     "N",
     "largest bucket of the sessions' reductions in bytes (0: the library's 25 MiB); with "
     "--overlap a bucket is reduced as soon as its gradients are ready"},
    {{"seed", required_argument, NULL, OPT_SEED}, "N", "seed of weights and tokens"},
    {{"backend", required_argument, NULL, OPT_BACKEND},
     "auto|host|nccl|mpi",
     "transport; auto: under mpirun nccl (bootstrapped over MPI) when every process has a GPU of "
     "its own, else mpi; otherwise nccl when every rank has a GPU of its own, else host"},
    {{"ranks-per-process", required_argument, NULL, OPT_RANKS_PER_PROCESS},
     "N",
     "under mpirun: every process hosts N rank threads of one world (the hybrid transport: "
     "host-staged inside a process, MPI between processes; docs/harness.md, Processes x "
     "threads); --world defaults to processes x N"},
    {{"out", required_argument, NULL, OPT_OUT},
     "DIR",
     "report.json and report.md go here (\"\" or none: no files)"},
    {{"dump", required_argument, NULL, OPT_DUMP},
     "DIR",
     "write the last step's rank{r}.safetensors and manifest.json here"},
    {{"summary", required_argument, NULL, OPT_SUMMARY},
     "FILE",
     "append this run's summary (a Markdown table row; the header if FILE is new) to FILE"},
    {{"quiet", no_argument, NULL, OPT_QUIET}, NULL, "print only errors and the result line"},
    {{"timeout", required_argument, NULL, OPT_TIMEOUT},
     "S",
     "seconds a collective may wait for a rank"},
    {{"reference-threads", required_argument, NULL, OPT_REFERENCE_THREADS},
     "N",
     "threads of the FP64 reference and its error scales (0: the machine's cores); the same "
     "bits for any N (docs/harness.md, Reference threads)"},
    {{"inject", required_argument, NULL, OPT_INJECT},
     "FAULT",
     "self-test: grad, replica or absent plant a defect on the last rank; fail stops every "
     "rank in step 1; ep-scale, rank-mean, router-tp, half-accum or another of docs/harness.md's "
     "known framework bugs (seldp-bugs --names) on every rank; refused where it cannot show"},
    {{"vocab", required_argument, NULL, OPT_VOCAB}, "N", "model: vocabulary V"},
    {{"d-model", required_argument, NULL, OPT_D_MODEL}, "N", "model: d_model D"},
    {{"d-ff", required_argument, NULL, OPT_D_FF}, "N", "model: d_ff F"},
    {{"experts", required_argument, NULL, OPT_EXPERTS}, "N", "model: experts E"},
    {{"top-k", required_argument, NULL, OPT_TOP_K}, "N", "model: experts per token K"},
    {{"layers", required_argument, NULL, OPT_LAYERS}, "N", "model: layers L"},
    {{"lora-rank", required_argument, NULL, OPT_LORA_RANK}, "N", "model: LoRA rank r (nf4, awq)"},
    {{"lora-alpha", required_argument, NULL, OPT_LORA_ALPHA},
     "X",
     "model: LoRA alpha (scale alpha/r)"},
    {{"shared-expert-ff", required_argument, NULL, OPT_SHARED_EXPERT_FF},
     "N",
     "model: d_ff of an ungated shared expert in every layer (a shared parameter; 0: none)"},
    {{"aux-loss-coeff", required_argument, NULL, OPT_AUX_LOSS_COEFF},
     "X",
     "model: load-balancing loss coefficient alpha (Switch/GShard, per layer; 0: off)"},
    {{"aux-loss-scope", required_argument, NULL, OPT_AUX_LOSS_SCOPE},
     "global|local",
     "model: the load-balancing loss over the whole global batch (counts allreduced in the "
     "forward) or each data shard's tokens"},
    {{"z-loss-coeff", required_argument, NULL, OPT_Z_LOSS_COEFF},
     "X",
     "model: router z-loss coefficient beta (ST-MoE; 0: off)"},
    {{"capacity-factor", required_argument, NULL, OPT_CAPACITY_FACTOR},
     "X",
     "model: expert capacity ceil(X*T*K/E) per rank and layer, later assignments dropped "
     "(0: no capacity)"},
    {{"micro-batches", required_argument, NULL, OPT_MICRO_BATCHES},
     "M",
     "gradient accumulation: each step runs M micro-batches (each rank's tokens cut in M; "
     "--global-batch must be a multiple of M), accumulates and reduces once; router losses per "
     "micro-batch weighted 1/M"},
    {{"pipeline-schedule", required_argument, NULL, OPT_PIPELINE_SCHEDULE},
     "1f1b|afab|sequential",
     "with --pp > 1: each stage's order of micro-batches, several in flight: 1f1b (Megatron's "
     "warmup, one forward one backward, cooldown), afab (every forward, then every backward) or "
     "sequential (one at a time); the same bits under each"},
    {{"global-batch", required_argument, NULL, OPT_GLOBAL_BATCH},
     "N",
     "layout-independent run: N tokens per step from one stream, split over the ranks (the "
     "first N mod world ranks take one more), and initial weights that depend only on the seed; "
     "replaces --tokens and --token-spread"},
    {{"save", required_argument, NULL, OPT_SAVE},
     "DIR",
     "write a checkpoint (safetensors shards + index.json) here at the end of the last step and "
     "of every --save-every-th step"},
    {{"save-every", required_argument, NULL, OPT_SAVE_EVERY},
     "N",
     "with --save: also after every N-th step (0: only after the last)"},
    {{"resume", required_argument, NULL, OPT_RESUME},
     "DIR",
     "continue from the checkpoint in DIR up to --steps, under any layout and world"},
    {{"sweep", required_argument, NULL, OPT_SWEEP},
     "FILE|PRESET",
     "run a list of layouts (a JSON file, or a preset: ep = every ep of --world in both "
     "orders, frameworks = every --framework with its orders, worlds = 1, 2, 4, 8, worlds-32) "
     "and compare each run's losses and final weights with the first run of its objective; "
     "sweep.md, sweep.json and a plot go to --out"},
    {{"help", no_argument, NULL, OPT_HELP}, NULL, "print this help and exit"},
    {{"version", no_argument, NULL, OPT_VERSION}, NULL, "print the library version and exit"},
};

const size_t hx_option_docs_n = sizeof hx_option_docs / sizeof hx_option_docs[0];
_Static_assert(sizeof hx_option_docs / sizeof hx_option_docs[0] <= HX_OPTIONS_MAX,
               "HX_OPTIONS_MAX is smaller than the option table");
