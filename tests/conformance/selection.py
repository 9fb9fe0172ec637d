"""Which of PyTorch's DDP tests the conformance suite runs, and why each other one does not.

The candidates are the tests of ``DistributedTest._DistTestBase`` that construct a
``DistributedDataParallel`` (directly or through a helper of the class): 102 in torch 2.13.
:data:`SELECTED` are the ones that exercise DDP's user-facing contract on CPU and that
PyTorch's own DDP passes here; ``ported`` marks those that upstream gates on two GPUs but that
need none (:mod:`port` rewrites their device placement). Every other candidate is in
:data:`EXCLUDED` with its reason; ``tests/conformance/test_selection.py`` checks that the two
lists cover the installed torch's candidates exactly.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Selected:
    name: str
    ported: bool = False  # upstream gates it on GPUs; it runs on CPU with its device placement rewritten


@dataclass(frozen=True)
class Excluded:
    name: str
    why: str


def _cpu(*names: str) -> list[Selected]:
    return [Selected(n) for n in names]


def _ported(*names: str) -> list[Selected]:
    return [Selected(n, ported=True) for n in names]


SELECTED: list[Selected] = [
    *_cpu(
        "test_DistributedDataParallelCPU",  # training equal to one process; the wrapper pickled and reloaded
        "test_DistributedDataParallelCPU_grad_is_view",
        "test_DistributedDataParallel_requires_grad",  # a module without parameters is refused
        "test_ddp_create_graph",  # backward(create_graph=True)
        "test_accumulate_gradients_no_sync",  # no_sync() accumulation equals one large batch
        "test_accumulate_gradients_no_sync_grad_is_view",
        "test_grads_same_across_ranks_with_no_sync",  # no_sync + find_unused_parameters, different layers per rank
        "test_accumulate_gradients_no_sync_allreduce_hook",  # a communication hook, with no_sync accumulation
        "test_accumulate_gradients_no_sync_allreduce_with_then_hook",  # ... returning a chained Future
    ),
    *_ported(
        "test_ddp_zero_output_features",  # a layer with zero-size parameters
        "test_ddp_grad_div_uneven_inputs",  # join(divide_by_initial_world_size=...) without an optimizer
        "test_ddp_join_model_equivalence",
        "test_ddp_uneven_input_join_disable",
        "test_ddp_uneven_input_exception",
        "test_ddp_shared_grad_acc_unused_params",  # an unused parameter under two names
        "test_ddp_namedtuple",
        "test_ddp_model_diff_num_params_across_ranks",
        "test_output_unused_in_loss_tuple_module",  # outputs not used in the loss: their gradients stay None
        "test_output_unused_in_loss_dict_module",
        "test_undefined_grad_parity_unused_parameters",  # undefined gradients reaching the hooks
        "test_ddp_static_graph_nested_types",
        "test_ddp_returns_tensor_with_no_grad",  # the same module wrapped again and again
        "test_ddp_new_tensor_in_fwd",
        "test_ddp_new_tensor_in_fwd_static_graph",
        "test_ddp_broadcast_buffer",
        "test_ddp_broadcast_buffers_deprecation_warning",  # forward_sync_buffers, broadcast_buffers' warning
        "test_ddp_join_respects_forward_sync_buffers_false",
        "test_ddp_init_sync_buffers_with_forward_sync_buffers_false",
        "test_static_graph_multi_forward",
        "test_ddp_forward_backward_hook",  # the user's own module hooks
        "test_ddp_compile_static_graph",  # torch.compile
        "test_ddp_hook_parity_allreduce",  # communication hooks against no hook, 100 iterations
        "test_ddp_hook_parity_allreduce_process_group",  # ... with a process group as the hook's state
        "test_ddp_hook_parity_powerSGD",  # ... PowerSGD, warm start on and off
        "test_ddp_ignore_params_arg",  # _set_params_and_buffers_to_ignore_for_model
        "test_get_data_parallel_params",
        "test_stateless_api_with_ddp",  # torch.func.functional_call through the wrapper
    ),
]
PORTED = [s.name for s in SELECTED if s.ported]

# Measured: the selected tests that still pass against a gradsched that never reduces (tests/mutant;
# docs/conformance.md). Both ranks of most upstream tests get the same inputs and seeds, and some
# assert nothing about gradients; the slow run of the mutant checks that exactly these pass.
PASS_WITHOUT_REDUCTION = frozenset({
    "test_DistributedDataParallel_requires_grad",
    "test_ddp_create_graph",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_ddp_zero_output_features",
    "test_ddp_uneven_input_exception",
    "test_ddp_shared_grad_acc_unused_params",
    "test_ddp_namedtuple",
    "test_ddp_model_diff_num_params_across_ranks",
    "test_output_unused_in_loss_tuple_module",
    "test_output_unused_in_loss_dict_module",
    "test_undefined_grad_parity_unused_parameters",
    "test_ddp_static_graph_nested_types",
    "test_ddp_returns_tensor_with_no_grad",
    "test_ddp_new_tensor_in_fwd",
    "test_ddp_new_tensor_in_fwd_static_graph",
    "test_ddp_broadcast_buffer",
    "test_ddp_broadcast_buffers_deprecation_warning",
    "test_ddp_join_respects_forward_sync_buffers_false",
    "test_ddp_init_sync_buffers_with_forward_sync_buffers_false",
    "test_static_graph_multi_forward",
    "test_ddp_forward_backward_hook",
    "test_ddp_compile_static_graph",
    "test_get_data_parallel_params",
    "test_stateless_api_with_ddp",
})

# The part of the selection every test run runs, under the default policy: tests that fail on the
# mutant (they check reduced gradients: training, accumulation with unused parameters, join, hooks,
# ignored parameters), and buffers.
CI = ("test_DistributedDataParallelCPU", "test_grads_same_across_ranks_with_no_sync", "test_ddp_join_model_equivalence",
      "test_ddp_hook_parity_powerSGD", "test_ddp_ignore_params_arg", "test_ddp_broadcast_buffer")

_INTERNALS = "reads DDP's internals ({}), not its user-facing contract"
_HOOK = ("runs DDP's post-local SGD ({}): after a number of steps it stops all-reducing gradients and averages "
         "parameters every few steps through its own optimizer, which replaces the per-step reduction gradsched "
         "schedules")
_CUDA = "needs CUDA by nature: {}"
_REFUSED = "uses {}, which gradsched refuses at construction (docs/guide.md)"
_UPSTREAM_SKIP = "skipped upstream itself: {}"
_TORCH_FAILS = "PyTorch's own DDP does not pass it on CPU, ported as the selected ones are (measured): {}"
_TEXT = "asserts the wording of DDP's own error message ({})"


def _each(why: str, *names: str) -> list[Excluded]:
    return [Excluded(n, why) for n in names]


EXCLUDED: list[Excluded] = [
    *_each(_UPSTREAM_SKIP.format("on Linux, pytorch/pytorch#76428"), "test_DistributedDataParallel_non_default_stream"),
    *_each(_UPSTREAM_SKIP.format("on Linux, pytorch/pytorch#77317"), "test_DistributedDataParallel"),
    *_each(_UPSTREAM_SKIP.format("on Linux, pytorch/pytorch#162676"), "test_ddp_model_diff_shape_across_ranks"),
    *_each(_UPSTREAM_SKIP.format("pytorch/pytorch#113620"), "test_ddp_sync_bn_training_vs_eval"),
    *_each(_UPSTREAM_SKIP.format("pytorch/pytorch#102751"), "test_ddp_has_finalized"),
    *_each(_UPSTREAM_SKIP.format("on Linux, pytorch/pytorch#77342; also DDP's profiler events"),
           "test_ddp_profiling_autograd_profiler"),
    *_each(_UPSTREAM_SKIP.format("pytorch/pytorch#137765; NCCL metadata"), "test_ddp_profiling_execution_trace"),
    *_each(_UPSTREAM_SKIP.format("as flaky; also a PowerSGD communication hook"), "test_ddp_hook_pickling_powerSGD"),
    *_each(_HOOK.format("post-local SGD"), "test_ddp_hook_parity_post_localSGD"),
    *_each(_HOOK.format("post-local SGD and its optimizer"), "test_post_localSGD_optimizer_parity",
           "test_post_localSGD_optimizer_parity_grad_is_view", "test_post_localSGD_optimizer_parity_with_hierarchical_sgd",
           "test_post_localSGD_optimizer_parity_with_hierarchical_sgd_grad_is_view",
           "test_post_localSGD_optimizer_step_reload"),
    *_each(_HOOK.format("and DDP's logging data"), "test_ddp_comm_hook_logging", "test_ddp_python_error_logged"),
    *_each(_INTERNALS.format("_register_buffer_comm_hook"), "test_ddp_buffer_hook_allreduce_return_future",
           "test_ddp_buffer_hook_allreduce", "test_ddp_broadcast_buffer_via_hook"),
    *_each(_INTERNALS.format("_get_ddp_logging_data"), "test_ddp_logging_data_cpu", "test_ddp_logging_data_gpu",
           "test_different_graph_across_ranks"),
    *_each(_INTERNALS.format("the reducer and DDP's logging data"), "test_ddp_control_flow_same_across_ranks",
           "test_ddp_control_flow_different_across_ranks", "test_detect_ddp_is_actually_static"),
    *_each(_TEXT.format("the unused parameters listed by DDP's own indices, with some ignored"),
           "test_ddp_multiple_nested_unused_params_err_ignore_params"),
    *_each(_INTERNALS.format("torch.distributed.optim._apply_optimizer_in_backward, which steps inside DDP's hooks"),
           "test_ddp_apply_optim_in_backward", "test_ddp_apply_optim_in_backward_grad_as_bucket_view_false",
           "test_ddp_apply_optim_in_backward_ignored_params"),
    *_each(_INTERNALS.format("_set_static_graph"), "test_static_graph_api_cpu"),
    *_each(_INTERNALS.format("_sync_module_states with DDP's process_group, broadcast_bucket_size and "
                             "parameters_to_ignore attributes"), "test_ddp_sync_module_states"),
    *_each(_INTERNALS.format("_build_params_for_reducer, _build_debug_param_to_name_mapping"),
           "test_ddp_build_debug_param_to_name_mapping", "test_ddp_build_debug_param_to_name_mapping_requires_grad"),
    *_each(_INTERNALS.format("_compute_bucket_assignment_by_size"),
           "test_compute_bucket_assignment_by_size_sparse_error_without_logger",
           "test_compute_bucket_assignment_by_size_sparse_error_with_logger"),
    *_each(_INTERNALS.format("_verify_param_shape_across_processes, on a subgroup as process_group"),
           "test_verify_model_across_rank_with_logger", "test_verify_model_across_rank_without_logger"),
    *_each(_INTERNALS.format("_remove_autograd_hooks"), "test_ddp_remove_autograd_hooks"),
    *_each(_INTERNALS.format("_set_ddp_sink_clone"), "test_ddp_sink_noclone"),
    *_each(_INTERNALS.format("DDP's profiler event names, on GPUs"), "test_ddp_profiling_torch_profiler"),
    *_each(_REFUSED.format("mixed_precision"), "test_ddp_native_mixed_precision_ignored_params",
           "test_ddp_native_mixed_precision_no_grad_as_bucket_view_no_set_grad_none",
           "test_ddp_native_mixed_precision_grad_as_bucket_view_no_set_grad_none",
           "test_ddp_native_mixed_precision_grad_as_bucket_view_set_grad_to_none",
           "test_ddp_native_mixed_precision_no_grad_as_bucket_view_set_grad_to_none"),
    *_each(_REFUSED.format("bucket_cap_mb_list"), "test_ddp_bucket_cap_mb_list"),
    *_each(_TEXT.format("DDP's errors for a process group given with a device mesh and for a 2-D mesh, and CUDA "
                        "meshes; gradsched takes 1-D meshes, tested in tests/distributed/test_everyday_calls.py"),
           "test_ddp_device_mesh_initialization"),
    *_each(_REFUSED.format("skip_all_reduce_unused_params"), "test_skip_all_reduce_unused_parameters"),
    *_each(_CUDA.format("SyncBatchNorm on GPU modules"), "test_DistributedDataParallel_SyncBatchNorm_Channels_Last",
           "test_DistributedDataParallel_SyncBatchNorm", "test_DistributedDataParallel_SyncBatchNorm_No_Affine",
           "test_DistributedDataParallel_SyncBatchNorm_2D_Input",
           "test_DistributedDataParallel_SyncBatchNorm_Single_Input_Per_Process",
           "test_DistributedDataParallel_SyncBatchNorm_Diff_Input_Sizes_Running_Value",
           "test_DistributedDataParallel_SyncBatchNorm_Diff_Input_Sizes_gradient",
           "test_DistributedDataParallel_SyncBatchNorm_half"),
    *_each(_CUDA.format("torch.cuda.amp on GPU modules"), "test_DistributedDataParallel_with_amp_and_grad_is_view"),
    *_each(_TORCH_FAILS.format("'SyncBatchNorm layers only work with GPU modules'"),
           "test_ddp_uneven_inputs_stop_iteration_sync_bn", "test_ddp_inference", "test_sync_bn_logged"),
    *_each(_TORCH_FAILS.format("it asserts that inputs were moved to CUDA device `rank`"), "test_ddp_device"),
    *_each(_TORCH_FAILS.format("one of its models holds SyncBatchNorm, and PyTorch's DDP does not finish it within "
                               "upstream's 400 s (2.13, measured again); it also asserts DDP's private "
                               "`_authoritative_rank`, which gradsched has no counterpart of"), "test_ddp_uneven_inputs"),
    *_each(_TEXT.format("'Your training graph has changed in this iteration' under static_graph=True; gradsched "
                        "accepts static_graph with no effect, measuring the graph every backward pass, so there "
                        "is no promise to break"), "test_invalid_static_graph"),
    *_each(_TEXT.format("the unused parameters listed by DDP's own indices"), "test_ddp_multiple_nested_unused_params_error"),
    *_each(_TEXT.format("DDP's 'Expected to have finished reduction' and its logging data"),
           "test_ddp_unused_params_rebuild_buckets_exception"),
]
