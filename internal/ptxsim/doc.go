// Package ptxsim runs PTX kernels on the CPU: it parses the PTX that
// scripts/genptx.sh commits and executes its entry points thread by thread,
// so that the kernels the GPU would run are exercised by every test run on
// machines without one.
//
// What it models, because our kernels depend on it:
//
//   - a program counter per thread (independent thread scheduling): a lane
//     spinning on a lock held by another lane of its warp lets the holder
//     run, so spin locks make progress as they do on sm_70 and later;
//   - converged lanes of a warp execute an instruction together, all lanes
//     reading their operands before any writes;
//   - shfl.sync, vote.sync and bar.warp.sync wait for every non-exited lane
//     of their member mask and fault when those lanes wait at different
//     instructions; bar.sync waits for every non-exited thread of the block
//     and faults when they wait at different barriers;
//   - a deadlock (every live thread of a block waiting) is reported with
//     where each thread waits; a kernel that runs past its step limit (a
//     spin that never ends) is reported the same way;
//   - atomics are exact: on global memory they are the host's atomic
//     instructions, so they are atomic against other processes mapping
//     the same memory;
//   - every access is checked: shared, local and param memory against
//     their sizes, global memory against the allocations of a Space, whose
//     device addresses lie outside any host address, and an access not
//     aligned to its size faults;
//   - optionally (Config.RaceCheck) two accesses to one byte of shared
//     memory by different threads between the same barriers, at least one
//     a plain write, are reported with both PTX lines.
//
// Schedules: Config.Seed 0 is deterministic (warps round robin, the lowest
// program counter of a warp first, the longest-waiting lanes now and then
// so spinning lanes cannot starve others); any other seed shuffles the
// warps, the lanes a warp runs next, how long it runs, and the order lanes
// of one instruction reach memory.
//
// What it does not model: the weak memory model (every access is
// sequentially consistent, so fences are no-ops and a missing fence goes
// unseen), occupancy and resource limits beyond those Config states,
// streams and asynchrony (a launch runs to completion when called),
// textures, floating point, and any instruction our kernels do not use:
// those are refused when the module is parsed, naming the line.
package ptxsim
