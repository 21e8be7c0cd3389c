-- Argo CD health of a goodput.dev ModelGroup, from the status the goodput operator writes.
--   Progressing  until the operator has observed the current generation, and while groups are
--                being placed, started, warmed or drained (Ready is not True);
--   Degraded     when the spec cannot be acted on (reason InvalidSpec) or Degraded is True
--                (a group failed, timed out placing, or a drain hit its limit);
--   Healthy      when Ready is True for the current generation.
local hs = {}

local function find(conditions, kind)
  for _, condition in ipairs(conditions) do
    if condition.type == kind then
      return condition
    end
  end
  return nil
end

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

local conditions = obj.status.conditions
for _, condition in ipairs(conditions) do
  if condition.reason == "InvalidSpec" then
    hs.status = "Degraded"
    hs.message = condition.message or "The spec cannot be acted on"
    return hs
  end
end

local degraded = find(conditions, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = degraded.message or degraded.reason or "Degraded"
  return hs
end

local ready = find(conditions, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or "All groups are ready"
  return hs
end

hs.status = "Progressing"
if ready ~= nil and ready.message ~= nil then
  hs.message = ready.message
else
  hs.message = "Waiting for the replica groups to become ready"
end
return hs
