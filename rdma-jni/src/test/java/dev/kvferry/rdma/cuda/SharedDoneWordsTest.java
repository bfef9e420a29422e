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
}
