-- Argo CD health of a goodput.dev SLOPolicy. A policy has no Ready condition: the operator reports
-- whether it accepted the spec (Accepted) and which revision it read (observedRevision).
--   Progressing  until the operator has observed the current generation and revision;
--   Degraded     when the operator refused the spec (Accepted False, reason InvalidSpec), so the
--                ModelGroups bound to it keep the last accepted revision;
--   Healthy      when Accepted is True for the current generation and revision.
local hs = {}

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the goodput operator to report status"
  return hs
end

local generation = obj.metadata.generation or 0
local observed = obj.status.observedGeneration or -1
if observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the goodput operator to observe generation " .. tostring(generation)
  return hs
end

local accepted = nil
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Accepted" then
    accepted = condition
  end
end

if accepted ~= nil and accepted.status == "False" and accepted.reason == "InvalidSpec" then
  hs.status = "Degraded"
  hs.message = accepted.message or "The policy was not accepted"
  return hs
end

local revision = obj.spec and obj.spec.revision
if accepted ~= nil and accepted.status == "True" and obj.status.observedRevision == revision then
  hs.status = "Healthy"
  hs.message = accepted.message or ("Revision " .. tostring(revision) .. " accepted")
  return hs
end

hs.status = "Progressing"
hs.message = "Waiting for revision " .. tostring(revision) .. " to be accepted"
return hs
