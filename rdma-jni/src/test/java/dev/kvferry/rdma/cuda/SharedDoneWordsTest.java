package dev.kvferry.rdma.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The owner side needs no GPU: a store into the shared file is seen by the owner's spin. */
class SharedDoneWordsTest {

  @TempDir Path dir;

  @Test
  void ownerSeesAStoreMadeThroughAnotherMappingAndDeletesTheFileOnClose() throws Exception {
    try (SharedDoneWords words = SharedDoneWords.create(dir, "done", 2)) {
      assertEquals(0, words.get(1));
      try (FileChannel ch = FileChannel.open(words.path(), StandardOpenOption.READ,
          StandardOpenOption.WRITE)) {
        ch.map(FileChannel.MapMode.READ_WRITE, 0, 16).order(ByteOrder.nativeOrder()).putLong(8, 7);
      }
      assertTrue(words.awaitAtLeast(1, 7, 1_000_000_000L) > 0);
      assertEquals(-1, words.awaitAtLeast(0, 1, 1_000_000L));
      assertThrows(IndexOutOfBoundsException.class, () -> words.get(2));
      assertThrows(IllegalStateException.class, () -> words.deviceAddress(0));
    }
    assertFalse(Files.exists(dir.resolve("done")));
  }

  @Test
  void aHintSitsBelowTheDoneValueAndAbovePreviousTransfersOfItsSlot() {
    long done = 3 * 4096 + 17; // the slot's third transfer in a file of 4096 words
    long previous = done - 4096;
    for (int behind = 1; behind < 100; behind++) {
      long hint = SharedDoneWords.progressValue(done, behind);
      assertTrue(hint < done && hint > previous, "behind " + behind);
      assertEquals(behind <= 2, SharedDoneWords.nearlyDone(hint, done, 2), "behind " + behind);
    }
    assertFalse(SharedDoneWords.nearlyDone(done, done, 2), "done is not a hint");
    assertFalse(SharedDoneWords.nearlyDone(previous, done, 2), "the previous transfer's done word");
    assertFalse(SharedDoneWords.nearlyDone(0, 1, 2), "a fresh file's zero");
    assertThrows(IllegalArgumentException.class, () -> SharedDoneWords.progressValue(done, 0));
  }

  private String refusal(String name, int slots) {
    return assertThrows(IllegalArgumentException.class,
        () -> SharedDoneWords.checkedPeerFile(dir, name, slots)).getMessage();
  }

  @Test
  void aPeerCannotNameAFileOfItsChoiceForPrefillToMapAndWrite() throws Exception {
    try (SharedDoneWords words = SharedDoneWords.create(dir, "kvferry-done-decode-0-42-ab", 4096)) {
      assertEquals(words.path(),
          SharedDoneWords.checkedPeerFile(dir, "kvferry-done-decode-0-42-ab", 4096));
      // Any path, or a name outside kvferry's pattern, is refused before anything is opened.
      for (String bad : new String[] {"/etc/passwd", "../kvferry-done-x", "kvferry-done-a/../../b",
          "passwd", "", "kvferry-done-..", "kvferry-done-"}) {
        assertTrue(refusal(bad, 4096).contains("not a kvferry done-word file"), bad);
      }
      assertTrue(refusal(null, 4096).contains("refused"));
      // The right name with the wrong word count: the file's size does not match.
      assertTrue(refusal("kvferry-done-decode-0-42-ab", 8).contains("bytes"));
      assertTrue(refusal("kvferry-done-decode-0-42-ab", Integer.MAX_VALUE).contains("at most"));
    }
    // A link with kvferry's name pointing at another file is not followed.
    Path target = Files.write(dir.resolve("victim"), new byte[32768]);
    Files.createSymbolicLink(dir.resolve("kvferry-done-link"), target);
    assertTrue(refusal("kvferry-done-link", 4096).contains("not a regular file"));
    assertTrue(refusal("kvferry-done-missing", 4096).contains("kvferry-done-missing"));
  }
}
