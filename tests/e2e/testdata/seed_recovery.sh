#!/usr/bin/env bash
# The seed's "by hand" recovery of one stalled group (Ursula 0.8 Operations,
# "Recovering after a host crash"), kept verbatim but for three changes the
# seed allows: the group and the admin URLs come from the environment
# (GROUP; ADMINS, space separated; TOKENS, the admin token files in the same
# order), and every POST carries its node's admin token.
set -u
read -r -a admins <<<"${ADMINS}"
read -r -a token_files <<<"${TOKENS}"
declare -A tokens
for i in "${!admins[@]}"; do tokens[${admins[$i]}]=${token_files[$i]}; done
cd "${WORKDIR}"

for admin in "${admins[@]}"; do
  curl -sS --fail "${admin}/__ursula/metrics" | jq -c --arg admin "${admin}" --argjson group "${GROUP}" '
    .process_incarnation as $incarnation
    | .raft_groups[] | select(.raft_group_id == $group)
    | {admin: $admin, process_incarnation: $incarnation, node_id,
       running: .maintenance.running,
       voters: .voter_configs, kept: .committed_voter_configs,
       gate: .recovery_gate, recovery, committed_index, committed_term, committed_node,
       last_applied_index,
       expected: {last_log_index, last_log_term, current_term}}'
done > replicas.jsonl

jq -sc 'def holds($n): any(.[]; . == $n);
  def votes($cut): .node_id as $n | any((if $cut then .kept else .voters end)[]; holds($n));
  . as $all | map(select(.running))
  | (map(.node_id)) as $answered
  | ([.[] | (.voters + .kept)[] | select(length > 0)] | unique) as $sets
  | if all($sets[]; (map(select(. as $n | $answered | holds($n))) | length) * 2 > length) then .
    else error("a reported voter set has no majority of its voters answering") end
  | ($sets | add | unique) as $voters
  | (map(select(.gate != "open" or .recovery != null) | .expected.current_term) | max // 0) as $floor
  | map(select(.node_id as $n | $voters | holds($n))) as $candidates
  | ($candidates | max_by([.expected.last_log_term // -1, .expected.last_log_index // -1, votes(false), .node_id])) as $longest
  | ((($longest.voters + $longest.kept) | add // [] | unique | length) == 1) as $single
  | ((($single | not)) and ((($longest.expected.last_log_term // 0) < $floor) or ($longest | votes(false) | not))) as $cut
  | (if $cut then ($candidates | map(select(votes(true))) | max_by([.committed_index // -1, .node_id])) else $longest end) as $leader
  | if $leader == null then error("no replica the plan may elect is a voter of the membership it would campaign under") else . end
  | {leader: $leader.node_id, cut: $cut,
     point: (if $cut then $leader.committed_index else $leader.expected.last_log_index end // 0)} as $plain
  | ($all | map(select(.committed_index != null and .committed_term != null))
     | max_by([.committed_index, .node_id])) as $known
  | (if $cut and $known != null and $known.committed_index > $plain.point then
       ($candidates | map(select(votes(true) and votes(false)
          and (.expected.last_log_index // -1) >= $known.committed_index))
        | max_by([.committed_index // -1, .node_id])) as $reaches
       | if $reaches == null then $plain else
           {leader: $reaches.node_id, cut: true, point: $known.committed_index,
            point_entry: {term: $known.committed_term, node_id: $known.committed_node}} end
     else $plain end) as $plan
  | if any($all[]; ([.committed_index // 0, .last_applied_index // 0] | max) > $plan.point) then
      error("a replica knows a later committed entry than the plan would keep") else . end
  | sort_by(.node_id != $plan.leader)[] | . + {plan: ($plan + {expected})}' replicas.jsonl > plan.jsonl || exit 1

leader_term=""
while read -r replica; do
  if [ -z "${leader_term}" ]; then
    body=$(jq -c --argjson highest "$(jq -s 'map(.expected.current_term) | max' replicas.jsonl)" \
      '.plan + {step: {lead: {highest_term: $highest}}}' <<<"${replica}")
  else
    body=$(jq -c --argjson term "${leader_term}" '.plan + {step: {follow: {leader_term: $term}}}' <<<"${replica}")
  fi
  admin=$(jq -r .admin <<<"${replica}")
  answer=$(curl -sS --fail-with-body -H "x-ursula-process-incarnation: $(jq -r .process_incarnation <<<"${replica}")" \
    -H "Authorization: Bearer $(cat "${tokens[${admin}]}")" \
    -H "content-type: application/json" -d "${body}" \
    -X POST "${admin}/__ursula/raft/${GROUP}/recovery/accept-unsynced-loss")
  status=$?
  echo "${answer}"
  [ "${status}" -eq 0 ] || exit 1
  leader_term=${leader_term:-$(jq -r .leader_term <<<"${answer}")}
done < plan.jsonl
