package dev.kvferry.cli;

import com.fasterxml.jackson.core.JsonLocation;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.kvferry.actors.plan.KvCacheGeometry;
import java.io.IOException;
import java.util.Iterator;
import java.util.List;
import java.util.Set;

/**
 * One request for {@code kvferry plan}, read from the JSON schema of the seed's planner script
 * (the bench peer {@code seed_planner.py}): layout, num_blocks, remote_num_blocks (defaults to
 * num_blocks), block_size, kv_heads and head_dim (standard, blocks_first: kvferry's own, not the
 * script's), latent (mla), elem_size,
 * local_block_ids, remote_block_ids. Fields the layout does not use are ignored, as the script
 * does; unknown fields are refused, so a misspelt optional field cannot fall back to its default.
 */
record PlanInput(
    KvCacheGeometry geometry, int remoteNumBlocks, int[] localBlockIds, int[] remoteBlockIds) {

  /** Input that cannot be planned; the message names the field. */
  static final class InvalidPlanInputException extends Exception {
    private static final long serialVersionUID = 1L;

    InvalidPlanInputException(String message) {
      super(message);
    }
  }

  private static final Set<String> FIELDS =
      Set.of(
          "layout",
          "num_blocks",
          "remote_num_blocks",
          "block_size",
          "kv_heads",
          "head_dim",
          "latent",
          "elem_size",
          "local_block_ids",
          "remote_block_ids");

  private static final ObjectMapper JSON =
      new ObjectMapper()
          .enable(JsonParser.Feature.STRICT_DUPLICATE_DETECTION)
          .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS);

  static PlanInput parse(byte[] json) throws InvalidPlanInputException {
    JsonNode root;
    try {
      root = JSON.readTree(json);
    } catch (JsonProcessingException e) {
      JsonLocation at = e.getLocation();
      throw new InvalidPlanInputException(
          "input is not valid JSON: "
              + e.getOriginalMessage().lines().findFirst().orElse("")
              + (at == null
                  ? ""
                  : " (line " + at.getLineNr() + ", column " + at.getColumnNr() + ")"));
    } catch (IOException e) {
      throw new InvalidPlanInputException("cannot read the input: " + e.getMessage());
    }
    if (root == null || root.isMissingNode()) {
      throw new InvalidPlanInputException("expected one JSON object on stdin, got nothing");
    }
    if (!root.isObject()) {
      throw new InvalidPlanInputException(
          "expected one JSON object on stdin, got " + root.getNodeType().name().toLowerCase());
    }
    for (Iterator<String> names = root.fieldNames(); names.hasNext(); ) {
      String name = names.next();
      if (!FIELDS.contains(name)) {
        throw new InvalidPlanInputException(
            "unknown field \"" + name + "\"; known fields: " + String.join(", ", sorted(FIELDS)));
      }
    }

    JsonNode layoutNode = required(root, "layout");
    String layout = layoutNode.isTextual() ? layoutNode.asText() : "";
    if (!Set.of("standard", "blocks_first", "mla").contains(layout)) {
      throw new InvalidPlanInputException(
          "layout must be \"standard\", \"blocks_first\" or \"mla\", got " + layoutNode);
    }
    int numBlocks = positiveInt(root, "num_blocks");
    int remoteNumBlocks =
        root.has("remote_num_blocks") ? positiveInt(root, "remote_num_blocks") : numBlocks;
    int blockSize = positiveInt(root, "block_size");
    int elementBytes = positiveInt(root, "elem_size");
    KvCacheGeometry geometry;
    try {
      geometry =
          switch (layout) {
            case "mla" ->
                KvCacheGeometry.mla(numBlocks, blockSize, positiveInt(root, "latent"), elementBytes);
            case "blocks_first" -> KvCacheGeometry.blocksFirst(numBlocks, blockSize,
                positiveInt(root, "kv_heads"), positiveInt(root, "head_dim"), elementBytes);
            default -> KvCacheGeometry.standard(numBlocks, blockSize,
                positiveInt(root, "kv_heads"), positiveInt(root, "head_dim"), elementBytes);
          };
    } catch (IllegalArgumentException e) {
      throw new InvalidPlanInputException(String.valueOf(e.getMessage()));
    }
    return new PlanInput(
        geometry,
        remoteNumBlocks,
        ids(root, "local_block_ids"),
        ids(root, "remote_block_ids"));
  }

  private static List<String> sorted(Set<String> names) {
    return names.stream().sorted().toList();
  }

  private static JsonNode required(JsonNode root, String field) throws InvalidPlanInputException {
    JsonNode node = root.get(field);
    if (node == null || node.isNull()) {
      throw new InvalidPlanInputException("missing field " + field);
    }
    return node;
  }

  private static int positiveInt(JsonNode root, String field) throws InvalidPlanInputException {
    JsonNode node = required(root, field);
    if (!node.isIntegralNumber() || !node.canConvertToInt() || node.intValue() < 1) {
      throw new InvalidPlanInputException(
          field + " must be an integer from 1 to " + Integer.MAX_VALUE + ", got " + node);
    }
    return node.intValue();
  }

  private static int[] ids(JsonNode root, String field) throws InvalidPlanInputException {
    JsonNode node = required(root, field);
    if (!node.isArray()) {
      throw new InvalidPlanInputException(field + " must be an array of block ids, got " + node);
    }
    int[] ids = new int[node.size()];
    for (int i = 0; i < ids.length; i++) {
      JsonNode id = node.get(i);
      if (!id.isIntegralNumber() || !id.canConvertToInt()) {
        throw new InvalidPlanInputException(
            field + "[" + i + "] must be an integer block id, got " + id);
      }
      ids[i] = id.intValue();
    }
    return ids;
  }
}
