// Command libcxltier is the C library that non-Go programs (the Python
// package under python/) load: build it with
//
//	go build -buildmode=c-shared -o libcxltier.so ./cmd/libcxltier
//
// which also writes libcxltier.h. The ABI is small and versioned
// (cxl_abi_version). Every call returns 0 or a negative code (the CXL_E*
// values below) and, on failure, writes a NUL-terminated message into the
// caller's errbuf of errlen bytes. Objects are named by opaque 64-bit
// handles; no Go pointer crosses the boundary, and the library only reads
// or writes caller memory (keys, payloads, ids) during the call.
//
// The calls (what changed between versions: docs/abi.md):
//
//	cxl_attach(devices, name, &tier)           devices: comma-separated backings
//	cxl_detach(tier)
//	cxl_tier_hold(tier, &hold)  /  cxl_tier_release(hold)   a hold across a view's life: detach waits for it
//	cxl_prefix_open(tier, name, key|NULL, blocks, block_bytes, &index)   blocks > 0: create if missing (with key)
//	cxl_prefix_close(index)
//	cxl_prefix_keys(page_size, tokens, n, prior|NULL, out, out_cap, &n_keys)
//	cxl_prefix_exists(index, keys, n, &n_leading)
//	cxl_prefix_set(index, keys, n, ptrs, sizes, statuses)      status: 0 stored, 1 present, 2 no space
//	cxl_prefix_get(index, keys, n, ptrs, caps, lens, &n_served)
//	cxl_prefix_setv(index, keys, n, per, ptrs, sizes, statuses)  each key's payload: its per pieces, concatenated
//	cxl_prefix_getv(index, keys, n, per, ptrs, sizes, &n_served) each payload into its per pieces, exactly filled
//	cxl_prefix_part_keys(text, ends, n, masks, n_masks, out)    n pages' strings × n_masks parts → keys, page-major
//	cxl_prefix_part_keys_joined(text, text_len, n, masks, n_masks, out)   the same, the n strings joined by NUL bytes
//	cxl_prefix_exists_pages(index, text, text_len, n, masks, n_masks, &leading)   leading pages with every part stored
//	cxl_prefix_verify_reads(index, on)                   gets check payload checksums (on by default)
//	cxl_prefix_delete(index, keys, n, &n_deleted)
//	cxl_prefix_stats(index, json, json_cap)             with "uplink": this process's fills and write-behind notices
//	cxl_prefix_list(index, out, out_cap, &n)             the keys of every ready entry (CXL_ERANGE with n when out is short)
//	cxl_prefix_has(index, keys, n, present)              each key ready (1) or not (0)
//	cxl_prefix_keep(index, keys, n, present, &pins)      pin the ready ones (no read, no hit) until cxl_prefix_unpin(pins)
//	cxl_prefix_names(tier, buf, buf_len, &n)             the tier's prefix indexes, each name NUL-terminated
//	cxl_uplink_off(tier)                                 indexes opened on tier from now on never ask the uplink (the uplink's own)
//	cxl_uplink_address(tier, buf, cap)                   the socket path of the node's uplink (for the uplink)
//	cxl_tier_mappings(tier, ptrs, lens, cap, &n, &hold)  each device mapping, to register with a transfer engine, mapped until cxl_tier_release(hold)
//	cxl_tier_replaced(tier, buf, cap)                    why the tier is not the one its paths name any more ("" while it is)
//	cxl_tier_registered(tier, &yes, why, why_cap)        whether this client proved who it is to its node's daemon
//	cxl_tier_populate(tier, &bytes)                      enter every tier page into this process's page tables, once
//	cxl_tier_lease(tier, &slot, &gen)                    this client's lease: what names it to its peers
//	cxl_tier_lease_gone(tier, slot, gen, &gone)          whether the client of that lease is gone (to stop waiting on it)
//	cxl_tier_link(tier, name, piece, buf, cap)           join the node's link arbiter (name NULL: node<N>; its name in buf): bulk copies give way to deadlines
//	cxl_link_stats(tier, name, buf, cap)                 a link table's sums as JSON (claims, misses, bulk bytes and waits)
//	cxl_link_turn(tier, bytes)                           a bulk piece's turn on the joined link (waits while a deadline is due)
//	cxl_rooms_open(tier, name, key, slots, slot_bytes, &rooms)  the rendezvous table of prefill-to-decode rooms (slots > 0: created when missing; key signs its records)
//	cxl_rooms_claim(rooms, room, rank, &slot, &gen)      a decode's room (anew when it is there: the earlier claim reads CXL_ENOTFOUND); CXL_ENOSPC when full
//	cxl_rooms_find(rooms, room, rank, &slot, &gen, &found)   the room a decode claimed
//	cxl_rooms_put(rooms, slot, gen, side, kind, data, n) one record of a side's (0 decode, 1 prefill); n = -1 deletes it
//	cxl_rooms_get(rooms, slot, gen, side, kind, buf, cap, &n, &found)   CXL_ERANGE with n when buf is short
//	cxl_rooms_end(rooms, slot, gen, side, &freed)        this side is done; the second side to end frees the room
//	cxl_rooms_release(rooms, slot, gen)                  frees the room
//	cxl_rooms_stats(rooms, json, json_cap)               slots, area_bytes, in_flight
//	cxl_rooms_close(rooms)
//	cxl_prefix_namespace(index, buf, cap)                the index's name across nodes (name, and a digest of its key)
//	cxl_prefix_pin(index, keys, n, addrs, lens, trailers, inplace, present, &pins)   pins each present key's payload in place, with its page trailer
//	cxl_prefix_unpin(pins)
//	cxl_prefix_fill_begin(index, keys, n, sizes, statuses, &fill)   blocks a transfer fills in place (prefix.Fill)
//	cxl_prefix_fill_blocks(fill, addrs, n)               the lease checked, where each block lies: right before the transfer
//	cxl_prefix_fill_commit(fill, trailer_ptrs, n, published)   checks each filled page against its trailer, publishes or aborts
//	cxl_prefix_fill_close(fill)                          aborts what was not committed
//	cxl_page_trailer_bytes()                             the size of a page's trailer on the wire
//	cxl_prefix_cluster_key(index, key, n)                pages pinned carry a MAC; fills publish only pages whose MAC checks
//	cxl_prefix_room(index, &bytes)                       a block's span: a transfer may fill that much of one
//	cxl_engram_hash(spec, layer, ids, n, out, out_cap, &n_rows) spec: preset name or JSON geometry
//	cxl_engram_table_name(model, table, rank, world, out, out_len)   SGLang's host table's object name (per-rank when world > 1)
//	cxl_engram_checkpoint_digest(checkpoint, layer, out, out_len)    a V4.1 checkpoint layer's digest, as seals record it
//	cxl_engram_open(tier, spec, engine, cuda_stream, slots, flags, deadline_ns, &pf)   engine: cpu, cuda, auto; flags: 1 cache, 2 plan on the engine
//	cxl_engram_prefetch(pf, layer, ids, lens, n_seqs, hist_ids|NULL, hist_lens|NULL, slots, slots_cap, &n_slots, &pending)
//	                 slots: written now when known (host planning, or no cache)
//	cxl_engram_wait(pending, slots|NULL, slots_cap, &ready_ns)   slots: the call's final slots
//	cxl_engram_buffer(pf, layer, &device_ptr, &bytes, &row_bytes)   GPU engines only
//	cxl_engram_read(pf, layer, slot, out, out_cap)                  copy one cached row out
//	cxl_engram_stats(pf, json, json_cap)
//	cxl_engram_close(pf)
//	cxl_engram_compress(pf, ids, n)                raw → compressed ids in place (the geometry's "lookup" table)
//	cxl_topk_open(tier, engine, cuda_stream, layers, entry_bytes, slots, k, max_requests, planner, max_context, &pool)   planner: auto, host, engine; max_context 0: 1M
//	cxl_topk_close(pool)
//	cxl_topk_register(pool, req, capacity)  /  cxl_topk_free(pool, req)  /  cxl_topk_len(pool, req, layer, &n)
//	cxl_topk_append(pool, req, layer, src, n_entries, where)      where: 0 host memory, 1 GPU memory (GPU engines)
//	cxl_topk_resolve(pool, layer, reqs, seq_lens, batch, topk, out, where, step[5]|NULL)
//	                 reqs, seq_lens: int64 host; topk, out: int32 [batch, k] in host or GPU memory;
//	                 step: hits, misses, fills, newest-token copies, bytes fetched
//	cxl_topk_buffer(pool, layer, &device_ptr, &bytes, &row_bytes, &rows_per_request)   GPU engines only
//	cxl_topk_read(pool, layer, req, slot, out, out_cap)             copy one slot's entry out
//	cxl_topk_stats(pool, json, json_cap)
//	cxl_region_alloc(tier, bytes, &offset, &address, &size)   contiguous tier memory for a tensor
//	cxl_region_free(tier, offset, size)
//	cxl_object_create(tier, name, bytes, flags, &obj, &address, &size)   flags: 1 contiguous; creates, then opens writable
//	cxl_object_open(tier, name, flags, &obj, &address, &size)   flags: 1 read-only view; the object is held while open
//	cxl_object_close(obj)
//	cxl_object_gather(obj, n_planes, planes, row_bytes, rows, ids, n, out, out_cap, threads)   row ids[i] of plane p (at byte planes[p]) to
//	                 out + n*(row_bytes[0]+…+row_bytes[p-1]) + i*row_bytes[p]; threads 0: every core
//	cxl_object_info(tier, name|NULL, json, json_cap)   NULL: every object
//	cxl_object_seal(tier, name, label)  /  cxl_object_unseal(tier, name)  /  cxl_object_verify(tier, name)
//	cxl_object_remove(tier, name, force)   refuses while live clients hold it, unless force (a damaged one: force only)
//	cxl_object_claim(tier, name)           become the loader of an unsealed object; CXL_EEXIST while another running client loads it
//	cxl_kvpool_open(index, engine, cuda_stream, n_bufs, per_layer, ptrs, lens, chunk_bytes, page_stride, where, verify, &pool)
//	                 an engine's paged KV buffers (layer-major, per_layer a layer): page p's chunk is
//	                 chunk_bytes at p*page_stride in each; an entry is a page's chunks in order
//	cxl_kvpool_close(pool)                      also closes its loads
//	cxl_kvpool_first_token(pool, loads, stores) the class of its loads on the link (1 first-token, 0 bulk, -1 as they are: first-token on a GPU's engine) and whether its stores take it
//	cxl_kvpool_store(pool, keys, n, pages, statuses)   pages[i] under keys[i], one scatter launch
//	cxl_kvpool_get(pool, keys, n, pages)        every page whole into pages[i], one gather launch, or CXL_ENOTFOUND; CXL_ECHECKSUM if a page was damaged
//	cxl_kvpool_load_start(pool, keys, n, pages, &load)   pins every entry, or CXL_ENOTFOUND
//	cxl_kvpool_load_layer(load, layer)          layers in order (the next one's copy queued ahead); after the last, CXL_ECHECKSUM if a page was damaged
//	cxl_kvpool_load_close(load)                 waits for a copy queued ahead, releases the pins; CXL_EINVAL if it stopped before its last layer
//
// GPU memory passed with where = 1 belongs to the engine's device and is
// read and written in order on its stream (cuda_stream at open).
//
// Keys are 32-byte digests back to back.
package main

// #include <stdint.h>
// enum {
//   CXL_OK = 0,
//   CXL_EINVAL = -1,     /* bad argument or configuration */
//   CXL_ENOTFOUND = -2,  /* no such index, handle or entry */
//   CXL_EEXIST = -3,     /* already exists */
//   CXL_ENOSPACE = -4,   /* tier or index full */
//   CXL_ECHECKSUM = -5,  /* a payload failed its checksum (entry dropped) */
//   CXL_ECLOSED = -6,    /* handle closed or client lost its lease */
//   CXL_ERANGE = -7,     /* a caller buffer is too small */
//   CXL_EDENIED = -8,    /* wrong or missing index key */
//   CXL_EBUSY = -9,      /* held by another client for now (lock wait timed out, entry pinned): retry */
//   CXL_EDAMAGED = -10,  /* shared metadata failed a consistency check: repair (cxltier repair) */
//   CXL_EOTHER = -99
// };
import "C"

// abiVersion changes whenever a call's meaning or signature does.
const abiVersion = 22

//export cxl_abi_version
func cxl_abi_version() C.int { return abiVersion }

func main() {}
