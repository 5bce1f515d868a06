"""The cases `make test` leaves to `make test-slow` (the `slow` marker, given here by node id),
so that `make test` stays under 12 minutes on a 2-core machine. Each one starts several
launches or waits out a bound; together they are under 5 % of the tests, and
`make test-slow` runs every one of them. Tests that mark `slow` themselves are long forms
whose short form stays in `make test`."""
from __future__ import annotations

# The same case on a second backend (or a second signal, rank or world): the first form,
# given as its value, stays in `make test`, so every case still runs there once.
OTHER_FORMS = {
    "tests/run/test_reliability.py::test_sigint_to_launcher_marks_interrupted_then_resume_finishes[gloo]":
        "tests/run/test_reliability.py::test_sigint_to_launcher_marks_interrupted_then_resume_finishes[mpi]",
    "tests/run/test_reliability_job.py::test_a_disk_that_fills_mid_run_fails_the_run_cleanly_then_resume_finishes[gloo]":
        "tests/run/test_reliability_job.py::test_a_disk_that_fills_mid_run_fails_the_run_cleanly_then_resume_finishes[mpi]",
    "tests/run/test_reliability_job.py::test_a_frozen_rank_is_named_as_not_arrived[gloo]":
        "tests/run/test_reliability_job.py::test_a_frozen_rank_is_named_as_not_arrived[mpi]",
    "tests/run/test_reliability.py::test_slow_tables_at_the_end_do_not_fail_a_finished_run[gloo]":
        "tests/run/test_reliability.py::test_slow_tables_at_the_end_do_not_fail_a_finished_run[mpi]",
    "tests/run/test_reliability_job.py::test_sigterm_or_sighup_to_the_launcher_ends_its_job[15-gloo]":
        "tests/run/test_reliability_job.py::test_sigterm_or_sighup_to_the_launcher_ends_its_job[15-mpi]",
    "tests/run/test_reliability_job.py::test_sigterm_or_sighup_to_the_launcher_ends_its_job[1-gloo]":
        "tests/run/test_reliability_job.py::test_sigterm_or_sighup_to_the_launcher_ends_its_job[1-mpi]",
    "tests/run/test_reliability_job.py::test_a_rank_frozen_after_the_run_was_marked_keeps_it_complete_and_ends[gloo]":
        "tests/run/test_reliability_job.py::test_a_rank_frozen_after_the_run_was_marked_keeps_it_complete_and_ends[mpi]",
    "tests/hostile/test_hostile_signals.py::test_sigterm_or_sighup_during_repeats_launches_no_further_repeat[15]":
        "tests/hostile/test_hostile_signals.py::test_sigterm_or_sighup_during_repeats_launches_no_further_repeat[1]",
    "tests/hostile/test_hostile_env.py::test_a_rank_that_never_comes_ends_start_up_within_the_timeout[1-jax]":
        "tests/hostile/test_hostile_env.py::test_a_rank_that_never_comes_ends_start_up_within_the_timeout[0-jax]",
    "tests/hostile/test_hostile_env.py::test_a_rank_that_never_comes_ends_start_up_within_the_timeout[0-gloo]":
        "tests/hostile/test_hostile_env.py::test_a_rank_that_never_comes_ends_start_up_within_the_timeout[1-gloo]",
    "tests/run/test_reliability.py::test_hang_ends_every_rank_with_the_point_named[hang_op-gloo]":
        "tests/run/test_reliability.py::test_hang_ends_every_rank_with_the_point_named[hang_op-mpi]",
    "tests/run/test_reliability.py::test_hang_ends_every_rank_with_the_point_named[hang_setup-gloo]":
        "tests/run/test_reliability.py::test_hang_ends_every_rank_with_the_point_named[hang_setup-mpi]",
    "tests/run/test_reliability_job.py::test_a_killed_launcher_takes_its_job_with_it[gloo]":
        "tests/run/test_reliability_job.py::test_a_killed_launcher_takes_its_job_with_it[mpi]",
    "tests/hostile/test_hostile_env.py::test_a_run_whose_reader_left_keeps_measuring[gloo]":
        "tests/hostile/test_hostile_env.py::test_a_run_whose_reader_left_keeps_measuring[mpi]",
    "tests/run/test_two_hosts.py::test_mpi_across_two_hosts_sees_two_nodes_by_hostname[2]":
        "tests/run/test_two_hosts.py::test_mpi_across_two_hosts_sees_two_nodes_by_hostname[4]",
    "tests/run/test_reliability.py::test_an_exception_on_one_rank_ends_every_rank_at_once_with_its_cause[gloo]":
        "tests/run/test_reliability.py::test_an_exception_on_one_rank_ends_every_rank_at_once_with_its_cause[mpi]",
    "tests/hostile/test_hostile_env.py::test_a_run_with_stdout_closed_completes[gloo]":
        "tests/hostile/test_hostile_env.py::test_a_run_with_stdout_closed_completes[mpi]",
    "tests/run/test_reliability.py::test_lost_rank_others_exit_and_rows_survive[gloo]":
        "tests/run/test_reliability.py::test_lost_rank_others_exit_and_rows_survive[mpi]",
}

# Long end-to-end cases: several launches each (repeats, variants, resume after a failure,
# namespace hosts) or a bound they must wait out. Their parts have faster tests in `make test`
# (the record's transitions, the contract, the verdicts on rows); these check the whole.
LONG_END_TO_END = (
    "tests/run/test_variants.py::test_a_later_variant_runs_longer_than_the_drain_bound_to_its_end",
    "tests/run/test_two_hosts.py::test_link_down_mid_run_ends_every_rank_in_bound_keeps_rows_and_resume_finishes",
    "tests/run/test_hoststate.py::test_repeat_measures_each_point_n_times_interleaved_and_compare_judges_between_repeats",
    "tests/report/test_plots.py::test_report_from_a_real_run",
    "tests/report/test_plots.py::test_two_runs_overlay",
    "tests/run/test_variants.py::test_variants_with_repeats_alternate_repeat_by_repeat_and_a_lost_launch_resumes",
    "tests/run/test_control.py::test_ab_alternates_fresh_launches_and_records_each_side",
    "tests/run/test_reliability_job.py::test_one_writer_per_run_directory",
    "tests/benchmarks/test_overlap.py::test_c_reference_agrees",
    "tests/run/test_run_contract.py::test_a_rank_of_run_np_prints_its_tables_as_the_launcher_was_told",
    "tests/run/test_two_hosts.py::test_moe_flat_and_hierarchical_scaleout_bytes_follow_the_routing_and_hostnames",
    "tests/hostile/test_hostile_signals.py::test_a_launch_whose_ranks_never_start_is_stopped_at_the_start_up_bound",
    "tests/backends/test_jax.py::test_faults_inside_programs_are_caught_and_moe_runs",
    "tests/run/test_pairs_hosts.py::test_a_trial_on_five_hosts_names_the_slow_link",
    "tests/analyse/test_variant_evidence.py::test_run_repeat_records_a_fresh_launch_per_repeat",
    "tests/run/test_launch.py::test_srun_with_master_addr_runs_gloo_as_the_whole_job",
    "tests/run/test_reliability_job.py::test_ranks_waiting_outside_a_smaller_world_end_with_it",
    "tests/backends/test_jax.py::test_four_ranks_with_sub_world_and_barrier_timing",
    "tests/run/test_launch.py::test_a_refusal_under_mpirun_reaches_the_user_once_with_the_cores_busy",
    "tests/moe/test_moe_bytes_sent.py::test_moe_decode_on_gloo_sends_only_the_routed_rows_and_passes_its_check",
    "tests/backends/test_moe_torch.py::test_gloo_torch_path_every_copy_and_dtype_at_2_and_4_ranks",
    "tests/moe/test_trace.py::test_run_refuses_every_bad_trace_and_conflict_before_any_rank_starts[False]",
    "tests/run/test_variants.py::test_external_launcher_runs_one_variant_per_launch",
    "tests/run/test_control.py::test_each_launch_records_a_control_at_its_start_and_end",
    "tests/run/test_hoststate.py::test_four_ranks_on_two_cores_say_so_at_start_and_on_every_row",
    "tests/benchmarks/test_moe_steps.py::test_gloo_every_path_takes_ragged_tokens_over_steps",
    "tests/run/test_variants.py::test_resume_reruns_only_the_unfinished_variant",
    "tests/report/test_anchor_views.py::test_both_placements_on_a_backend_with_one_measure_it_once",
    "tests/run/test_reliability_job.py::test_too_little_space_for_the_planned_rows_is_refused_up_front[256k]",
    "tests/moe/test_moe_modes.py::test_low_latency_capacity_too_small_overflows_and_the_check_says_so",
    "tests/benchmarks/test_moe_bench.py::test_a_moe_runs_stages_are_not_taken_for_duplicates_but_a_doubled_row_is",
    "tests/benchmarks/test_every_benchmark.py::test_gloo_pairs_and_all_dtypes",
    "tests/benchmarks/test_pairs_bench.py::test_rank_mode_on_4_ranks_gives_the_full_matrix",
    "tests/benchmarks/test_moe_dispatchers.py::test_a_resume_counts_a_skipped_point_done_and_does_not_ask_again",
    "tests/moe/test_trace.py::test_a_replayed_hot_rank_trace_runs_checked_and_rows_show_the_load",
    "tests/run/test_two_hosts.py::test_gloo_rendezvous_address_no_host_has_is_one_line_and_quick",
    "tests/benchmarks/test_moe_dispatchers.py::test_host_dispatchers_a_skipped_one_and_a_plug_in_in_one_mpi_run",
    "tests/backends/test_moe_allgather.py::test_gloo_allgather_dispatcher_passes_the_exact_check_with_physical_bytes",
    "tests/run/test_pairs_hosts.py::test_three_hosts_have_their_own_hostnames_and_mpirun_sees_three_nodes",
    "tests/benchmarks/test_moe_bench.py::test_two_tiers_on_one_host",
    "tests/benchmarks/test_pairs_bench.py::test_fail_on_outlier_names_a_planted_slow_pair",
    "tests/moe/test_trace.py::test_commbench_routing_prints_the_hot_ranks_load",
    "tests/run/test_reliability_job.py::test_the_teardown_is_bounded_even_when_the_interpreter_is_held",
    "tests/hostile/test_hostile_env.py::test_an_unanswering_jax_coordinator_is_bounded",
    "tests/hostile/test_hostile_env.py::test_a_bad_jax_coordinator_is_one_line[busy]",
)

SLOW_NODE_IDS = frozenset(OTHER_FORMS) | frozenset(LONG_END_TO_END)
KEPT_NODE_IDS = frozenset(OTHER_FORMS.values())
